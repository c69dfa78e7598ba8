// Package envflag makes every flag of a flag.FlagSet settable from an
// environment variable, as the Crossplane providers built on kingpin do
// (DefaultEnvars): --max-reconcile-rate is also MAX_RECONCILE_RATE. A flag
// on the command line wins over the environment, which wins over the
// default. This is how a DeploymentRuntimeConfig or a Helm chart sets a
// provider's options without replacing its arguments.
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

// Name is the environment variable of the flag name: upper case, dashes as
// underscores.
func Name(flagName string) string {
	return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse sets every flag of fs whose variable lookup finds, except the
// flags named in except, then parses args over them. A variable that does
// not parse is an error naming it and its flag.
func Parse(fs *flag.FlagSet, args []string, lookup func(string) (string, bool), except ...string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || slices.Contains(except, f.Name) {
			return
		}
		v, ok := lookup(Name(f.Name))
		if !ok {
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			err = fmt.Errorf("environment variable %s (flag --%s) is %q: %w", Name(f.Name), f.Name, v, serr)
		}
	})
	if err != nil {
		return err
	}
	fs.Usage = func() { Usage(fs.Output(), fs, except...) }
	return fs.Parse(args)
}

// Usage writes every flag with its variable and default (no variable for
// the flags in except).
func Usage(w io.Writer, fs *flag.FlagSet, except ...string) {
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	sort.Slice(fl, func(i, j int) bool { return fl[i].Name < fl[j].Name })
	fmt.Fprintf(w, "Usage of %s (every flag can also be set from the environment variable shown):\n", fs.Name())
	for _, f := range fl {
		env := Name(f.Name)
		if slices.Contains(except, f.Name) {
			env = "no variable"
		}
		fmt.Fprintf(w, "  --%s (%s, default %q)\n    \t%s\n", f.Name, env, f.DefValue, f.Usage)
	}
}

// Lookup is os.LookupEnv, for Parse.
func Lookup(key string) (string, bool) { return os.LookupEnv(key) }
