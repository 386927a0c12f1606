package etcdtest

import (
	"context"
	"testing"
	"time"
)

func TestRestartKeepsDataAndEndpoint(t *testing.T) {
	s, c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := c.Get(short, "/k"); err == nil {
		t.Error("Get succeeded while etcd was stopped")
	}
	cancelShort()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v, %v", resp, err)
	}
	rev, err := s.Compact(ctx)
	if err != nil || rev < 2 {
		t.Fatalf("compact: %d, %v", rev, err)
	}
}
