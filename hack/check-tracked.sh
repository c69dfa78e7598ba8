#!/usr/bin/env bash
# Fails when git tracks a build output: an executable binary (ELF) or any
# file over 1 MiB. `go build ./hack/x` or `go build ./cmd/x` without -o
# drops a binary at the root, and `git add -A` then commits it into every
# clone's history for good.
set -euo pipefail
bad=0
# Binary files are those git grep -I passes over; few, so each is read.
while IFS= read -r f; do
	[ -f "$f" ] || continue
	if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
		echo "tracked binary (a build output?): $f" >&2
		bad=1
	fi
done < <(comm -23 <(git ls-files | sort) <(git grep -I -l -e '' -- . | sort))
while read -r size f; do
	if [ "$size" -gt 1048576 ]; then
		echo "tracked file over 1 MiB: $f ($size bytes)" >&2
		bad=1
	fi
done < <(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null || true)
if [ "$bad" = 1 ]; then
	echo "git rm --cached the files above; build outputs belong in bin/ (ignored)." >&2
	exit 1
fi
