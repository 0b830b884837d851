package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// writeVersion prints the module's version and the commit this binary was
// built from.
func writeVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintf(w, "dlock: no build information in this binary (%s)\n", runtime.Version())
		return
	}
	formatVersion(w, bi)
}

// formatVersion prints what the Go toolchain recorded in bi: the module's
// version ("(devel)" for a build from a checkout, the tag for go install
// ...@version) and the commit with its time, when the build could read
// them from git.
func formatVersion(w io.Writer, bi *debug.BuildInfo) {
	fmt.Fprintf(w, "dlock %s (module %s)\n", bi.Main.Version, bi.Main.Path)
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		commit := "commit " + rev
		if t := settings["vcs.time"]; t != "" {
			commit += " of " + t
		}
		if settings["vcs.modified"] == "true" {
			commit += ", with changes not committed"
		}
		fmt.Fprintln(w, commit)
	} else {
		fmt.Fprintln(w, "commit unknown: built without version control information (-buildvcs=false, or not in a git clone)")
	}
	fmt.Fprintf(w, "built with %s for %s/%s\n", bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}
