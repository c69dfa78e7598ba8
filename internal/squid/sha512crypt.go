package squid

import (
	"crypto/sha512"
	"strconv"
)

// This file implements SHA-512-crypt ("$6$"), the scheme of Ulrich
// Drepper's "Unix crypt using SHA-256 and SHA-512" specification, with the
// standard library only.
//
// Why this scheme: basic_ncsa_auth checks a password by calling the C
// library's crypt() first, and every libc that Squid images are built on
// (glibc, Debian's libxcrypt, musl) implements $6$, whereas bcrypt ($2b$)
// and yescrypt ($y$) depend on the libc and, for bcrypt, would need a new
// module. The Apache MD5 scheme ($apr1$) that basic_ncsa_auth also knows is
// far weaker.

// cryptAlphabet is crypt's base-64 alphabet, which differs from RFC 4648.
const cryptAlphabet = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

const (
	// sha512CryptDefaultRounds is the specification's default; it is left
	// out of the output so that every crypt() reads the hash the same way.
	sha512CryptDefaultRounds = 5000
	// sha512CryptMaxSalt is the longest salt the specification uses; longer
	// salts are cut.
	sha512CryptMaxSalt = 16
)

// sha512Crypt returns the $6$ hash of password with salt and rounds, as
// crypt(3) would print it.
func sha512Crypt(password, salt []byte, rounds int) string {
	if len(salt) > sha512CryptMaxSalt {
		salt = salt[:sha512CryptMaxSalt]
	}
	if rounds < 1000 {
		rounds = 1000
	}
	if rounds > 999999999 {
		rounds = 999999999
	}
	const size = sha512.Size

	// Digest B: password, salt, password.
	b := sha512.New()
	b.Write(password)
	b.Write(salt)
	b.Write(password)
	sumB := b.Sum(nil)

	// Digest A.
	a := sha512.New()
	a.Write(password)
	a.Write(salt)
	for n := len(password); n > 0; n -= size {
		a.Write(sumB[:min(n, size)])
	}
	for n := len(password); n > 0; n >>= 1 {
		if n&1 != 0 {
			a.Write(sumB)
		} else {
			a.Write(password)
		}
	}
	sumA := a.Sum(nil)

	// Sequence P: digest of the password repeated once per byte of it.
	dp := sha512.New()
	for range len(password) {
		dp.Write(password)
	}
	p := repeatTo(dp.Sum(nil), len(password))

	// Sequence S: digest of the salt repeated 16+A[0] times.
	ds := sha512.New()
	for range 16 + int(sumA[0]) {
		ds.Write(salt)
	}
	s := repeatTo(ds.Sum(nil), len(salt))

	// The rounds: the slow part.
	c := sumA
	h := sha512.New()
	for i := range rounds {
		h.Reset()
		if i&1 != 0 {
			h.Write(p)
		} else {
			h.Write(c)
		}
		if i%3 != 0 {
			h.Write(s)
		}
		if i%7 != 0 {
			h.Write(p)
		}
		if i&1 != 0 {
			h.Write(c)
		} else {
			h.Write(p)
		}
		c = h.Sum(c[:0])
	}

	out := make([]byte, 0, 3+len("rounds=999999999$")+len(salt)+1+86)
	out = append(out, "$6$"...)
	if rounds != sha512CryptDefaultRounds {
		out = append(out, "rounds="...)
		out = strconv.AppendInt(out, int64(rounds), 10)
		out = append(out, '$')
	}
	out = append(out, salt...)
	out = append(out, '$')
	// The specification's byte order: 21 groups of three bytes taken
	// k, k+21, k+42 and rotated by k mod 3, then the last byte alone.
	for k := range 21 {
		x, y, z := c[k], c[k+21], c[k+42]
		switch k % 3 {
		case 1:
			x, y, z = y, z, x
		case 2:
			x, y, z = z, x, y
		}
		out = appendCrypt64(out, uint(x)<<16|uint(y)<<8|uint(z), 4)
	}
	out = appendCrypt64(out, uint(c[63]), 2)
	return string(out)
}

// repeatTo returns digest repeated (and cut) to n bytes.
func repeatTo(digest []byte, n int) []byte {
	out := make([]byte, n)
	for i := 0; i < n; i += len(digest) {
		copy(out[i:], digest)
	}
	return out
}

// appendCrypt64 appends n characters of w, least significant six bits
// first, in crypt's base-64 alphabet.
func appendCrypt64(out []byte, w uint, n int) []byte {
	for range n {
		out = append(out, cryptAlphabet[w&0x3f])
		w >>= 6
	}
	return out
}
