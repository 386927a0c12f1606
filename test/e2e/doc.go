// Package e2e holds the process-level tests and benchmarks of vpp-route-agent: the daemon binary, built
// once per test run, runs as a child process against an embedded etcd and a VPP simulator (in-process,
// or the cmd/vppsim binary), and is observed only from outside: its exit status, its stderr, its HTTP
// endpoints, etcd and the simulator's FIB and request log.
//
//	go test ./test/e2e/                                                  # the tests
//	go test -run '^$' -bench . -benchtime 1x ./test/e2e/                 # the benchmarks
//
// The package has no non-test code but this comment.
package e2e
