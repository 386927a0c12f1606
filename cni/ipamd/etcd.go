package ipamd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdClient runs the allocator's transactions on the daemon's one long-lived clientv3 client. Only
// transactions are used: a read is a transaction of range operations, so several reads cost one
// round trip, and every write is a transaction with compares.
type etcdClient struct {
	kv clientv3.KV
	// callTimeout bounds one round trip.
	callTimeout time.Duration
}

// compare and op are etcd's: a transaction's conditions and requests.
type (
	compare = clientv3.Cmp
	op      = clientv3.Op
)

// modRevisionIs requires key's mod revision to be rev (0: the key does not exist).
func modRevisionIs(key string, rev int64) compare {
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

// valueIs requires key to exist with exactly this value.
func valueIs(key string, value []byte) compare {
	return clientv3.Compare(clientv3.Value(key), "=", string(value))
}

// absent requires key not to exist.
func absent(key string) compare { return clientv3.Compare(clientv3.Version(key), "=", 0) }

// noneCreatedSince requires that no key under prefix was created after revision rev.
func noneCreatedSince(prefix string, rev int64) compare {
	return clientv3.Compare(clientv3.CreateRevision(prefix), "<", rev+1).WithPrefix()
}

func getOp(key string) op { return clientv3.OpGet(key) }

func prefixOp(prefix string, keysOnly bool) op {
	if keysOnly {
		return clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	}
	return clientv3.OpGet(prefix, clientv3.WithPrefix())
}

func putOp(key string, value []byte) op { return clientv3.OpPut(key, string(value)) }

func deleteOp(key string) op { return clientv3.OpDelete(key) }

// kv is one key-value pair as read.
type kv struct {
	Key         string
	Value       []byte
	ModRevision int64
}

// txnResult is the outcome of a transaction: the store revision it ran at, whether the compares
// held, and for each range operation of the branch that ran, the pairs it read.
type txnResult struct {
	Revision  int64
	Succeeded bool
	Ranges    [][]kv
}

// txn runs one transaction: if every compare holds, the success ops, else the failure ops. An etcd
// that does not answer within callTimeout, or answers "unavailable", gives an error wrapping
// errUnavailable (retried by the caller); a request etcd refuses for good an error with code
// ErrDatastore.
func (c *etcdClient) txn(ctx context.Context, cmps []compare, success, failure []op) (*txnResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcd transaction: %w (%w)", errUnavailable, err)
	}
	cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	resp, err := c.kv.Txn(cctx).If(cmps...).Then(success...).Else(failure...).Commit()
	if err != nil {
		if retryable(err) || cctx.Err() != nil {
			return nil, fmt.Errorf("etcd transaction: %w: %w", errUnavailable, err)
		}
		return nil, withCode(ErrDatastore, "etcd refused the transaction: %w", err)
	}
	out := &txnResult{Revision: resp.Header.Revision, Succeeded: resp.Succeeded}
	for _, r := range resp.Responses {
		rr := r.GetResponseRange()
		if rr == nil {
			continue
		}
		kvs := make([]kv, 0, len(rr.Kvs))
		for _, k := range rr.Kvs {
			kvs = append(kvs, kv{Key: string(k.Key), Value: k.Value, ModRevision: k.ModRevision})
		}
		out.Ranges = append(out.Ranges, kvs)
	}
	return out, nil
}

// retryable reports the errors that mean "try again": no leader, a member shutting down or
// unreachable, a deadline, or throttling.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrLeaderChanged) || errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrStopped) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}
