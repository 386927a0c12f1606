package cni_test

import (
	"testing"
)

func TestSmoke(t *testing.T) {
	e := newEnv(t)
	e.putPool("default-ipv4-ippool", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	r := e.mustAdd(list, rt("c1", "eth0"))
	t.Logf("%v", addrs(r))
	r2 := e.mustAdd(list, rt("c2", "eth0"))
	t.Logf("%v", addrs(r2))
	e.mustDel(list, rt("c1", "eth0"))
	t.Logf("%+v", e.snapshot().Allocations)
}
