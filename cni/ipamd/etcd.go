package ipamd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
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

// noneChangedSince requires that no key under prefix was created or modified after revision rev (a
// key deleted since is not seen: the range holds only the keys that exist).
func noneChangedSince(prefix string, rev int64) compare {
	return clientv3.Compare(clientv3.ModRevision(prefix), "<", rev+1).WithPrefix()
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

func kvOf(k *mvccpb.KeyValue) kv {
	return kv{Key: string(k.Key), Value: k.Value, ModRevision: k.ModRevision}
}

func kvsOf(kvs []*mvccpb.KeyValue) []kv {
	out := make([]kv, len(kvs))
	for i, k := range kvs {
		out[i] = kvOf(k)
	}
	return out
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
		out.Ranges = append(out.Ranges, kvsOf(rr.Kvs))
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

// list reads every key under the prefixes, in pages of limit keys, all at one revision: the first
// page linearizable, the next ones serializable at its revision (what a revision holds never
// changes, and any member can answer it from its own store). Each page has its own callTimeout
// and is handed to page before the next is read, so a listing of any size holds one page in
// memory; ctx bounds the whole listing. A page that fails for a transient reason, or that a member
// that has not applied the revision yet answers with ErrFutureRev, is asked again after a capped
// backoff; a compacted revision is the caller's to restart. It returns the revision and the round trips.
func (c *etcdClient) list(ctx context.Context, prefixes []string, limit int64, page func([]kv)) (rev, roundTrips int64, err error) {
	bo := backoff.Backoff{Base: 5 * time.Millisecond, Max: 100 * time.Millisecond}
	for _, prefix := range prefixes {
		key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev), clientv3.WithSerializable())
			}
			roundTrips++
			cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
			resp, err := c.kv.Get(cctx, key, opts...)
			cancel()
			switch {
			case err != nil && !errors.Is(err, rpctypes.ErrCompacted) && (retryable(err) || errors.Is(err, rpctypes.ErrFutureRev)) && bo.Wait(ctx):
				// A read at a fixed revision is idempotent: one page's transient error (a
				// leader election, the page's deadline) does not throw the listing away.
				continue
			case errors.Is(err, rpctypes.ErrCompacted):
				return rev, roundTrips, fmt.Errorf("list %s at revision %d: %w: the revision was compacted during the listing: %w", prefix, rev, errUnavailable, err)
			case err != nil && (retryable(err) || ctx.Err() != nil || errors.Is(err, rpctypes.ErrFutureRev)):
				return rev, roundTrips, fmt.Errorf("list %s (page %d of %d keys): %w: %w", prefix, roundTrips, limit, errUnavailable, err)
			case err != nil:
				return rev, roundTrips, withCode(ErrDatastore, "list %s: etcd refused the read: %w", prefix, err)
			}
			bo.Reset()
			if rev == 0 {
				rev = resp.Header.Revision
			}
			page(kvsOf(resp.Kvs))
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	return rev, roundTrips, nil
}
