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

// Compare targets and results.
const (
	targetVersion = "VERSION"
	targetCreate  = "CREATE"
	targetMod     = "MOD"
	targetValue   = "VALUE"

	resultEqual = "="
	resultLess  = "<"
)

// compare is one etcd Compare: target(key) result value, over [key, rangeEnd) when rangeEnd is set
// (then every key in the range must satisfy it; an empty range compares as a missing key).
type compare struct {
	result   string
	target   string
	key      string
	rangeEnd string
	value    int64  // the version, create revision or mod revision compared with
	bytes    []byte // the value compared with (target VALUE)
}

// modRevisionIs requires key's mod revision to be rev (0: the key does not exist).
func modRevisionIs(key string, rev int64) compare {
	return compare{result: resultEqual, target: targetMod, key: key, value: rev}
}

// valueIs requires key to exist with exactly this value.
func valueIs(key string, value []byte) compare {
	return compare{result: resultEqual, target: targetValue, key: key, bytes: value}
}

// absent requires key not to exist.
func absent(key string) compare {
	return compare{result: resultEqual, target: targetVersion, key: key, value: 0}
}

// noneCreatedSince requires that no key under prefix was created after revision rev.
func noneCreatedSince(prefix string, rev int64) compare {
	return compare{result: resultLess, target: targetCreate, key: prefix, rangeEnd: prefixEnd(prefix), value: rev + 1}
}

// opKind is the kind of request in a transaction.
type opKind int

const (
	opRange opKind = iota
	opPut
	opDelete
)

// op is one request of a transaction: a range read, a put or a delete.
type op struct {
	kind     opKind
	key      string
	rangeEnd string // range only
	keysOnly bool   // range only
	value    []byte // put only
}

func getOp(key string) op { return op{kind: opRange, key: key} }

func prefixOp(prefix string, keysOnly bool) op {
	return op{kind: opRange, key: prefix, rangeEnd: prefixEnd(prefix), keysOnly: keysOnly}
}

func putOp(key string, value []byte) op { return op{kind: opPut, key: key, value: value} }

func deleteOp(key string) op { return op{kind: opDelete, key: key} }

// prefixEnd returns the range end that selects every key starting with prefix.
func prefixEnd(prefix string) string {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	return "\x00"
}

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
	ccmps := make([]clientv3.Cmp, len(cmps))
	for i, cm := range cmps {
		ccmps[i] = cm.clientv3()
	}
	resp, err := c.kv.Txn(cctx).If(ccmps...).Then(clientOps(success)...).Else(clientOps(failure)...).Commit()
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

// clientv3 converts the compare.
func (cm compare) clientv3() clientv3.Cmp {
	var target clientv3.Cmp
	var value any = cm.value
	switch cm.target {
	case targetVersion:
		target = clientv3.Version(cm.key)
	case targetCreate:
		target = clientv3.CreateRevision(cm.key)
	case targetMod:
		target = clientv3.ModRevision(cm.key)
	case targetValue:
		target, value = clientv3.Value(cm.key), string(cm.bytes)
	}
	out := clientv3.Compare(target, cm.result, value)
	if cm.rangeEnd != "" {
		out = out.WithRange(cm.rangeEnd)
	}
	return out
}

func clientOps(ops []op) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, o := range ops {
		switch o.kind {
		case opRange:
			var opts []clientv3.OpOption
			if o.rangeEnd != "" {
				opts = append(opts, clientv3.WithRange(o.rangeEnd))
			}
			if o.keysOnly {
				opts = append(opts, clientv3.WithKeysOnly())
			}
			out[i] = clientv3.OpGet(o.key, opts...)
		case opPut:
			out[i] = clientv3.OpPut(o.key, string(o.value))
		case opDelete:
			out[i] = clientv3.OpDelete(o.key)
		}
	}
	return out
}
