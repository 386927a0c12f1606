package cni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// TestEtcdClient drives the gateway client against a real etcd: compares that hold and fail, the
// failure branch's reads, large (chunked) responses, keys-only ranges, a refused request, and an
// unreachable endpoint.
func TestEtcdClient(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := newEtcdClient([]string{"http://127.0.0.1:1", srv.Endpoint()}, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()

	// Create-if-absent succeeds once, then fails and runs the failure reads.
	res, err := c.txn(ctx, []compare{absent("/k")}, []op{putOp("/k", []byte("v1"))}, []op{getOp("/k")})
	if err != nil || !res.Succeeded {
		t.Fatalf("create: %+v %v", res, err)
	}
	rev := res.Revision
	res, err = c.txn(ctx, []compare{absent("/k")}, []op{putOp("/k", []byte("v2"))}, []op{getOp("/k")})
	if err != nil || res.Succeeded || len(res.Ranges) != 1 || string(res.Ranges[0][0].Value) != "v1" || res.Ranges[0][0].ModRevision != rev {
		t.Fatalf("second create: %+v %v", res, err)
	}
	// Update at the right revision, then at a stale one.
	if res, err = c.txn(ctx, []compare{modRevisionIs("/k", rev)}, []op{putOp("/k", []byte("v3"))}, nil); err != nil || !res.Succeeded {
		t.Fatalf("update: %+v %v", res, err)
	}
	if res, err = c.txn(ctx, []compare{modRevisionIs("/k", rev)}, []op{deleteOp("/k")}, nil); err != nil || res.Succeeded {
		t.Fatalf("stale delete: %+v %v", res, err)
	}

	// A range compare over a prefix: no key created since a revision.
	if _, err := cli.Put(ctx, "/p/a", "x"); err != nil {
		t.Fatal(err)
	}
	res, _ = c.txn(ctx, nil, []op{prefixOp("/p/", true)}, nil)
	listed := res.Revision
	if res, err = c.txn(ctx, []compare{noneCreatedSince("/p/", listed)}, nil, nil); err != nil || !res.Succeeded {
		t.Fatalf("nothing created: %+v %v", res, err)
	}
	if _, err := cli.Put(ctx, "/p/b", "x"); err != nil {
		t.Fatal(err)
	}
	if res, err = c.txn(ctx, []compare{noneCreatedSince("/p/", listed)}, nil, nil); err != nil || res.Succeeded {
		t.Fatalf("created since: %+v %v", res, err)
	}

	// 300 keys of 2 KB: a chunked response of ~800 KB.
	big := bytes.Repeat([]byte("x"), 2048)
	for i := range 300 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/big/%03d", i), string(big)); err != nil {
			t.Fatal(err)
		}
	}
	res, err = c.txn(ctx, nil, []op{prefixOp("/big/", false), prefixOp("/big/", true)}, nil)
	if err != nil || len(res.Ranges) != 2 || len(res.Ranges[0]) != 300 || !bytes.Equal(res.Ranges[0][299].Value, big) ||
		len(res.Ranges[1]) != 300 || len(res.Ranges[1][0].Value) != 0 {
		t.Fatalf("big range: %v", err)
	}
	// The connection stays usable after a chunked body.
	if res, err = c.txn(ctx, nil, []op{getOp("/k")}, nil); err != nil || string(res.Ranges[0][0].Value) != "v3" {
		t.Fatalf("after big range: %v", err)
	}
	if got := c.roundTrips.Load(); got < 9 {
		t.Errorf("round trips counted %d", got)
	}

	// More operations than etcd allows in one transaction: refused for good.
	var many []op
	for i := range 200 {
		many = append(many, getOp(fmt.Sprintf("/m/%d", i)))
	}
	_, err = c.txn(ctx, nil, many, nil)
	var ce *codedError
	if !errors.As(err, &ce) || ce.code != ErrDatastore {
		t.Fatalf("too many ops: %v", err)
	}

	// Nothing reachable: errUnavailable.
	dead, _ := newEtcdClient([]string{"http://127.0.0.1:1"}, nil, time.Second)
	if _, err := dead.txn(ctx, nil, []op{getOp("/k")}, nil); !errors.Is(err, errUnavailable) {
		t.Fatalf("unreachable: %v", err)
	}
}
