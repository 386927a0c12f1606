// Package scale holds the fan-out harness of issue 13 (`make bench-scale`): M watchers running the
// real blockwatch code and a few real vpp-route-agent processes against one etcd, directly or behind
// etcd's gRPC proxy, measuring per pod ADD the bytes etcd sends and the CPU each watcher costs. etcd
// and the proxy run in their own processes, behind a TCP relay that counts etcd's egress on the wire,
// so that the CPU of the test process is the watchers' own. It has no non-test code.
package scale
