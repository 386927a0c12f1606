package vpptopo

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestVXLANNetns: the namespace is made, runs commands inside (its loopback is its own), refuses a
// second one of the same name, and Delete removes it. Needs root and a kernel with VXLAN.
func TestVXLANNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace")
	}
	name := fmt.Sprintf("vtn%d", os.Getpid()%100000)
	ns, err := NewVXLANNetns(name)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(ns.Delete)
	out, err := ns.Exec("ip", "-o", "link", "show")
	if err != nil || !strings.Contains(out, "lo:") || strings.Contains(out, "vxprobe") {
		t.Errorf("ip link inside: %q, %v: want its loopback and no probe device left", out, err)
	}
	if _, err := NewVXLANNetns(name); err == nil {
		t.Errorf("a second namespace %s was made", name)
	}
	ns.Delete()
	if list, _ := Command("ip", "netns", "list"); strings.Contains(list, name) {
		t.Errorf("namespace %s still listed after Delete: %q", name, list)
	}
	if _, err := Command("false"); err == nil || !strings.Contains(err.Error(), "false") {
		t.Errorf("Command(false) = %v, want an error naming the command", err)
	}
}
