package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallCopiesItselfAtomically(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "block-ipam")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	dest := t.TempDir()
	os.WriteFile(filepath.Join(dest, "block-ipam"), []byte("old version"), 0o755)
	out, err := exec.Command(bin, "install", "--dest", dest).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "installed "+filepath.Join(dest, "block-ipam")) {
		t.Fatalf("install: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(bin)
	got, err := os.ReadFile(filepath.Join(dest, "block-ipam"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("installed file differs from the binary (%d vs %d bytes): %v", len(got), len(want), err)
	}
	entries, _ := os.ReadDir(dest)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	st, _ := os.Stat(filepath.Join(dest, "block-ipam"))
	if st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v", st.Mode())
	}
	// The installed copy is a working plugin.
	cmd := exec.Command(filepath.Join(dest, "block-ipam"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), `"1.1.0"`) {
		t.Errorf("installed plugin VERSION: %v %s", err, out)
	}
	// Bad destination: a clear error, nothing written.
	if out, err := exec.Command(bin, "install", "--dest", filepath.Join(dest, "missing")).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "is not a directory") {
		t.Errorf("missing dest: %v %s", err, out)
	}
}

// TestDaemonSubcommand: `block-ipam daemon` runs block-ipamd from beside the plugin (replacing its
// process), and says what is missing when there is none.
func TestDaemonSubcommand(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", dir+"/", ".", "../block-ipamd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "block-ipam"), "daemon", "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "block-ipamd ") {
		t.Errorf("block-ipam daemon --version: %v %q", err, out)
	}
	alone := t.TempDir()
	data, _ := os.ReadFile(filepath.Join(dir, "block-ipam"))
	os.WriteFile(filepath.Join(alone, "block-ipam"), data, 0o755)
	cmd := exec.Command(filepath.Join(alone, "block-ipam"), "daemon")
	cmd.Env = []string{"PATH=" + alone}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "block-ipamd is neither beside this binary nor on PATH") {
		t.Errorf("without block-ipamd: %v %q", err, out)
	}
}
