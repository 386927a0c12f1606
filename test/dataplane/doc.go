// Package dataplane holds the tests that send packets: real vpp-route-agent processes program real VPP
// processes (the lab build, wired by internal/vpptopo with memif through a fabric or a router VPP) from
// Calico blocks in an embedded etcd, and VPP's ping between pod addresses on different nodes shows whether
// the routes carry traffic.
//
//	VPP_TEST_BACKEND=real VPP_LAB_PKG=/opt/vpp-v26.06-lab go test ./test/dataplane/    # or make test-vpp
//
// Without VPP_TEST_BACKEND=real and VPP_LAB_PKG the tests are skipped. The package has no non-test code
// but this comment.
package dataplane
