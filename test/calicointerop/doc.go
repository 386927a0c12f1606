// Package calicointerop tests block-ipam against Project Calico's own calico-ipam and calicoctl on one
// etcd: both plugins on other nodes and on the same node at once, DELs and releases across the two,
// node deletion, IP reservations, borrowing both ways, IPv6, and `calicoctl ipam check` clean after
// every scenario. It needs Calico's binaries: `make test-calico` builds them with
// build-calico/build-calico.sh (in this directory) and runs the tests with CALICO_BIN_DIR pointing at them; without
// that variable every test skips.
package calicointerop
