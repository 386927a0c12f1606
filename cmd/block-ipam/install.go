package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
)

// install copies this binary into a CNI bin directory atomically (a temporary file in the destination,
// fsynced, then renamed over the plugin), so that a runtime never executes a half-written plugin. It is
// how the DaemonSet's init container, whose image has no shell, installs the plugin on the host.
func install(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("block-ipam install", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	dest := fs.String("dest", "/host/opt/cni/bin", "CNI bin directory to install into")
	name := fs.String("name", "block-ipam", "file name of the installed plugin")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *name == "" || strings.ContainsRune(*name, '/') {
		return fmt.Errorf("--name %q must be a plain file name", *name)
	}
	if st, err := os.Stat(*dest); err != nil || !st.IsDir() {
		return fmt.Errorf("--dest %s is not a directory: %v", *dest, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("open %s: %w", self, err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(*dest, "."+*name+".tmp-")
	if err != nil {
		return fmt.Errorf("create a temporary file in %s: %w", *dest, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	target := filepath.Join(*dest, *name)
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fmt.Errorf("install %s: %w", target, err)
	}
	fmt.Fprintf(stdout, "installed %s\n", target)
	return nil
}

// runInstall is main's branch for `block-ipam install`; runtimes never pass arguments to a plugin.
func runInstall() {
	if err := install(os.Args[2:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "block-ipam install:", err)
			os.Exit(1)
		}
	}
	os.Exit(0)
}
