// Package envflag makes every flag of a flag.FlagSet settable from an
// environment variable of the project's own: EGRESSPROXY_ and the flag's
// name, so --max-reconcile-rate is also EGRESSPROXY_MAX_RECONCILE_RATE.
// The prefix keeps variables a platform injects into every container
// (DEBUG, NAMESPACE, INSECURE, ...) from setting a flag by accident;
// kingpin's DefaultEnvars, which the Crossplane providers use, prefixes
// the same way (with the binary's name). A flag may also have aliases:
// the unprefixed names Crossplane's package runtime sets (POD_NAMESPACE,
// TLS_SERVER_CERTS_DIR) and those the Crossplane providers read by an
// explicit Envar (LEADER_ELECTION, ENABLE_CHANGE_LOGS, ...). A flag on the
// command line wins over the prefixed variable, which wins over an alias,
// which wins over the default. This is how a DeploymentRuntimeConfig or a
// Helm chart sets a provider's options without replacing its arguments.
package envflag

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// Prefix begins the variable of every flag.
const Prefix = "EGRESSPROXY_"

// Name is the environment variable of the flag name: Prefix, then the
// name in upper case with dashes as underscores.
func Name(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Options says which flags have no variable and which have aliases.
type Options struct {
	// Except are the flags no variable sets.
	Except []string
	// Aliases are, by flag name, unprefixed variables that also set the
	// flag, in order of precedence, below the prefixed one.
	Aliases map[string][]string
}

// variables are the names the flag is read from, in order of precedence;
// none for a flag in Except.
func (o Options) variables(flagName string) []string {
	if slices.Contains(o.Except, flagName) {
		return nil
	}
	return append([]string{Name(flagName)}, o.Aliases[flagName]...)
}

// Parse sets every flag of fs from the first of its variables lookup
// finds, then parses args over them. A variable that does not parse is an
// error naming it and its flag; an alias naming no flag of fs is an error
// (a typo would silently read nothing).
func Parse(fs *flag.FlagSet, args []string, lookup func(string) (string, bool), o Options) error {
	for name := range o.Aliases {
		if fs.Lookup(name) == nil {
			return fmt.Errorf("envflag: alias for --%s, which is no flag", name)
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		for _, env := range o.variables(f.Name) {
			v, ok := lookup(env)
			if !ok {
				continue
			}
			if serr := f.Value.Set(v); serr != nil {
				err = fmt.Errorf("environment variable %s (flag --%s) is %q: %w", env, f.Name, v, serr)
			}
			return
		}
	})
	if err != nil {
		return err
	}
	fs.Usage = func() { Usage(fs.Output(), fs, o) }
	return fs.Parse(args)
}

// Usage writes every flag with its variables and default.
func Usage(w io.Writer, fs *flag.FlagSet, o Options) {
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	sort.Slice(fl, func(i, j int) bool { return fl[i].Name < fl[j].Name })
	fmt.Fprintf(w, "Usage of %s (every flag can also be set from the environment variables shown, the first set one winning):\n", fs.Name())
	for _, f := range fl {
		env := strings.Join(o.variables(f.Name), ", also ")
		if env == "" {
			env = "no variable"
		}
		fmt.Fprintf(w, "  --%s (%s, default %q)\n    \t%s\n", f.Name, env, f.DefValue, f.Usage)
	}
}

// Lookup is os.LookupEnv, for Parse.
func Lookup(key string) (string, bool) { return os.LookupEnv(key) }
