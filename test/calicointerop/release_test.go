package calicointerop_test

import (
	"maps"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// TestReleaseNode: a node whose pods both plugins served dies (no liveness key, no registration);
// `block-ipam release-node` (the plugin binary, which runs block-ipamd) lists its blocks in a dry
// run that writes nothing, then with --yes releases its pods' addresses, its affinities and its
// blocks: calicoctl ipam check finds no problem, the other node's allocations by both plugins are
// exactly as they were, and the freed subnets are claimed again by either plugin.
func TestReleaseNode(t *testing.T) {
	w := newWorld(t)
	// 4 blocks of 16: the dead node's blocks must come back for the new nodes to get theirs.
	w.apply(poolRes("pool", "10.104.0.0/26", 28, ""), nodeRes("dead", nil), nodeRes("stays", nil))
	w.run([]op{
		{p: calicoIPAM, node: "dead", cid: "d1", f: v4only}, {p: blockIPAM, node: "dead", cid: "d2", f: v4only},
		{p: calicoIPAM, node: "stays", cid: "s1", f: v4only}, {p: blockIPAM, node: "stays", cid: "s2", f: v4only},
	})
	w.run(append(batch(false, calicoIPAM, "dead", "dc", 10, v4only), batch(false, blockIPAM, "dead", "db", 10, v4only)...))
	w.check()
	others := func() map[netip.Addr]string {
		m := map[netip.Addr]string{}
		for _, a := range w.snapshot().Allocations {
			if a.Secondary[calico.AttrNode] != "dead" {
				m[a.Addr] = a.Handle + " " + a.Secondary[calico.AttrPod] + " " + a.Secondary["network"]
			}
		}
		return m
	}
	before := others()
	if len(before) != 2 {
		t.Fatalf("other node's allocations: %v", before)
	}
	deadBlocks := 0
	for _, b := range w.snapshot().Blocks {
		if calico.OwnerOf(b, false).Node == "dead" {
			deadBlocks++
		}
	}
	if deadBlocks < 2 {
		t.Fatalf("the dead node holds %d blocks, want at least 2", deadBlocks)
	}

	releaseNode := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(pluginDir, "block-ipam"), append([]string{"release-node", "--etcd-endpoints", w.ep}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("block-ipam release-node %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	rev := w.snapshot().Revision
	out := releaseNode("dead")
	if !strings.Contains(out, "summary: 22 addresses") || w.snapshot().Revision != rev {
		t.Fatalf("dry run (revision %d -> %d):\n%s", rev, w.snapshot().Revision, out)
	}
	out = releaseNode("--yes", "dead")
	if !strings.Contains(out, "node dead: complete, 22 addresses released") {
		t.Fatalf("release:\n%s", out)
	}
	t.Logf("block-ipam release-node --yes dead:\n%s", out[strings.LastIndex(out[:len(out)-1], "\n")+1:])
	for cid, pd := range w.pods {
		if pd.node == "dead" {
			delete(w.pods, cid)
		}
	}
	w.check()
	if after := others(); !maps.Equal(before, after) {
		t.Fatalf("the other node's allocations changed:\nbefore %v\nafter  %v", before, after)
	}
	for c, b := range w.snapshot().Blocks {
		if calico.OwnerOf(b, false).Node == "dead" {
			t.Fatalf("block %s still the dead node's", c)
		}
	}
	// The subnets come back: new nodes of either plugin claim them.
	w.apply(nodeRes("newc", nil), nodeRes("newb", nil))
	w.run(append(batch(false, calicoIPAM, "newc", "nc", 12, v4only), batch(false, blockIPAM, "newb", "nb", 12, v4only)...))
	w.check()
	// One block was free before the release: both new nodes own one only if the release freed more.
	owners := map[string]int{}
	for _, b := range w.snapshot().Blocks {
		owners[calico.OwnerOf(b, false).Node]++
	}
	if owners["newc"] == 0 || owners["newb"] == 0 {
		t.Fatalf("blocks by owner after the new nodes' pods: %v", owners)
	}
	if out := releaseNode("--yes", "dead"); !strings.Contains(out, "nothing to release (last release recorded at") {
		t.Fatalf("rerun:\n%s", out)
	}
}

// TestReleaseNodeKeepsBorrowed: another node borrowed an address in the dead node's block; the
// release frees the dead node's pods and leaves that block without owner (affinity null, as
// Calico's ReleaseHostAffinities) holding the borrowed address: calicoctl ipam check finds no
// problem; when calico-ipam then releases the borrowed address, it deletes the emptied block.
func TestReleaseNodeKeepsBorrowed(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.105.0.0/27", 28, ""), nodeRes("dead", nil), nodeRes("stays", nil))
	w.run([]op{{p: calicoIPAM, node: "dead", cid: "d1", f: v4only}, {p: blockIPAM, node: "dead", cid: "d2", f: v4only}})
	w.run(batch(false, blockIPAM, "stays", "s", 16, v4only))
	borrowed := w.mustAdd(blockIPAM, "stays", "sb", v4only)
	deadBlock, b := w.blockOf(borrowed.addrs[0])
	if calico.OwnerOf(b, false).Node != "dead" {
		t.Fatalf("sb's %s is in %s, not in the dead node's block", borrowed.addrs[0], deadBlock)
	}
	w.check()
	out, err := exec.Command(filepath.Join(pluginDir, "block-ipam"), "release-node", "--etcd-endpoints", w.ep, "--yes", "dead").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "blocks left without owner (1): "+deadBlock.String()) {
		t.Fatalf("release-node: %v\n%s", err, out)
	}
	delete(w.pods, "d1")
	delete(w.pods, "d2")
	w.check()
	if _, b := w.blockOf(borrowed.addrs[0]); b == nil || b.Affinity != nil || b.Allocated() != 1 {
		t.Fatalf("the dead node's block after the release: %+v", b)
	}
	w.mustDel(calicoIPAM, "stays", "sb", v4only)
	if b := w.snapshot().Blocks[deadBlock]; b != nil {
		t.Fatalf("block %s, empty and without owner, kept by calico-ipam", deadBlock)
	}
	w.check()
}
