// Package buildinfo holds the version stamped into every binary at link time.
package buildinfo

import "runtime/debug"

// Version is set by the Makefile and the Dockerfile with -ldflags "-X .../buildinfo.Version=...".
var Version = "dev"

// Revision returns the VCS revision Go recorded in the binary, or "unknown".
func Revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return "unknown"
}

// GoVersion returns the Go toolchain version the binary was built with.
func GoVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return info.GoVersion
}
