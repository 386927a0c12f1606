package ipamd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// TestListen: the socket is created 0600 in a new 0700 directory; a socket left by a dead daemon is
// replaced; one a live daemon listens on is refused; a non-socket file is refused.
func TestListen(t *testing.T) {
	dir, err := os.MkdirTemp("", "bi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "run", "block-ipam.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(sock); st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", st.Mode().Perm())
	}
	if st, _ := os.Stat(filepath.Dir(sock)); st.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", st.Mode().Perm())
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := Listen(sock); err == nil || !strings.Contains(err.Error(), "another block-ipam daemon") {
		t.Errorf("second daemon on a live socket: %v", err)
	}
	// A dead daemon's socket: the file stays, nobody accepts.
	l.UnixListener.Close()
	l2, err := Listen(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v", err)
	}
	if _, err := Listen("relative.sock"); err == nil {
		t.Error("relative path accepted")
	}
}

// TestRequestChecks: the daemon refuses, before queueing, a node name other than its own (naming
// both). The CNI rules are checked where the request enters (cni.Decode; TestDecodeChecksEachRule).
func TestRequestChecks(t *testing.T) {
	s := &Server{cfg: Config{Node: "node1"}}
	ok := cni.Request{Verb: "ADD", ContainerID: "c1", IfName: "eth0", Network: "net1", Assign: [2]bool{true, false}}
	if err := s.validate(&ok); err != nil {
		t.Fatalf("valid request: %v", err)
	}
	for _, tc := range []struct {
		mod  func(r *cni.Request)
		code uint
		want string
	}{
		{func(r *cni.Request) { r.Node = "node2" }, 7, `names node "node2", but the block-ipam daemon at this socket serves node "node1"`},
	} {
		r := ok
		tc.mod(&r)
		err := s.validate(&r)
		if err == nil || err.Code != tc.code || !strings.Contains(err.Msg, tc.want) {
			t.Errorf("%+v: %v, want code %d with %q", r, err, tc.code, tc.want)
		}
	}
	r := ok
	r.Node = "node1"
	if err := s.validate(&r); err != nil {
		t.Errorf("the daemon's own node name refused: %v", err)
	}
}
