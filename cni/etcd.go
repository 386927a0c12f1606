package cni

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// etcdClient speaks etcd's v3 KV API through the JSON gRPC gateway that every etcd v3.4+ member
// serves on its client URL (POST /v3/kv/txn; on unless etcd runs with --enable-grpc-gateway=false).
//
// Why not clientv3: a CNI plugin is a process per call. Measured on the reference machine, a binary
// built on clientv3/gRPC spends ~9 ms starting (package init, a 22 MB binary) against ~3.5 ms, and
// even a bare gRPC call from a fresh process takes ~2.9 ms (HTTP/2 set-up) against ~1.8 ms for one
// HTTP/1.1 request. So the client writes HTTP/1.1 itself on one kept-alive connection (see
// httpwire.go): one request is one etcd round trip, which roundTrips counts.
//
// Only transactions are used: a read is a transaction of range operations, so several reads cost one
// round trip, and every write is a transaction with compares. The client is meant for the one
// goroutine of a plugin call; a mutex keeps concurrent use safe anyway.
type etcdClient struct {
	endpoints   []endpoint
	tls         *tls.Config
	callTimeout time.Duration
	// roundTrips counts requests sent to etcd (including failed ones).
	roundTrips atomic.Int64

	mu   sync.Mutex // guards the fields below
	cur  int        // endpoint that answered last; tried first
	conn *httpConn  // open connection to endpoints[cur], nil when none
}

// endpoint is a parsed etcd client URL.
type endpoint struct {
	url  string // as configured, for messages
	host string // host:port
	tls  bool
}

// TLSFiles names the PEM files of the etcd client's TLS configuration; all empty means no client
// certificate (https endpoints then verify the server with the system roots).
type TLSFiles struct {
	CACertFile, CertFile, KeyFile string
}

// newEtcdClient returns a client of the endpoints (validated http:// or https:// URLs), with the TLS
// configuration cfg for https (nil: system roots, no client certificate). It opens no connection.
func newEtcdClient(endpoints []string, cfg *tls.Config, callTimeout time.Duration) (*etcdClient, error) {
	c := &etcdClient{callTimeout: callTimeout, tls: cfg}
	for _, e := range endpoints {
		u, err := url.Parse(e)
		if err != nil {
			return nil, configError("etcd_endpoints", "%q: %v", e, err)
		}
		host := u.Host
		if u.Port() == "" {
			host += ":2379"
		}
		c.endpoints = append(c.endpoints, endpoint{url: e, host: host, tls: u.Scheme == "https"})
	}
	return c, nil
}

// loadTLS builds the TLS configuration from PEM files; errors name the file's configuration key.
func loadTLS(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CACertFile != "" {
		pem, err := os.ReadFile(f.CACertFile)
		if err != nil {
			return nil, configError("etcd_ca_cert_file", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configError("etcd_ca_cert_file", "%s holds no PEM certificate", f.CACertFile)
		}
		cfg.RootCAs = pool
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		if f.CertFile == "" {
			return nil, configError("etcd_cert_file", "must be set together with etcd_key_file")
		}
		return nil, configError("etcd_key_file", "must be set together with etcd_cert_file")
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, configError("etcd_cert_file", "loading %s and %s: %v", f.CertFile, f.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// close closes the connection.
func (c *etcdClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.close()
		c.conn = nil
	}
}

// Names of etcd's Compare enums in the gateway's JSON.
const (
	targetVersion = "VERSION"
	targetCreate  = "CREATE"
	targetMod     = "MOD"
	targetValue   = "VALUE"

	resultEqual = "EQUAL"
	resultLess  = "LESS"
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

// noneModifiedSince requires that no key under prefix was written after revision rev (a deletion
// goes unnoticed).
func noneModifiedSince(prefix string, rev int64) compare {
	return compare{result: resultLess, target: targetMod, key: prefix, rangeEnd: prefixEnd(prefix), value: rev + 1}
}

// unmodifiedSince requires that key was not written after revision rev (or does not exist).
func unmodifiedSince(key string, rev int64) compare {
	return compare{result: resultLess, target: targetMod, key: key, value: rev + 1}
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
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
}

// txnResult is the outcome of a transaction: the store revision it ran at, whether the compares
// held, and for each range operation of the branch that ran, the pairs it read.
type txnResult struct {
	Revision  int64
	Succeeded bool
	Ranges    [][]kv
}

// jsonInt64 reads an int64 the gateway writes as a JSON string (or, leniently, a number).
type jsonInt64 int64

func (v *jsonInt64) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "null" {
		*v = 0
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	*v = jsonInt64(n)
	return err
}

type txnRespJSON struct {
	Header struct {
		Revision jsonInt64 `json:"revision"`
	} `json:"header"`
	Succeeded bool `json:"succeeded"`
	Responses []struct {
		Range *struct {
			Kvs []struct {
				Key            []byte    `json:"key"`
				Value          []byte    `json:"value"`
				CreateRevision jsonInt64 `json:"create_revision"`
				ModRevision    jsonInt64 `json:"mod_revision"`
			} `json:"kvs"`
		} `json:"response_range"`
	} `json:"responses"`
}

// gatewayError is the error body the gateway returns with a non-200 status.
type gatewayError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// retryableGRPC reports the gRPC status codes that mean "try again": DeadlineExceeded,
// ResourceExhausted, Aborted, Unavailable.
func retryableGRPC(code int) bool { return code == 4 || code == 8 || code == 10 || code == 14 }

// txn runs one transaction: if every compare holds, the success ops, else the failure ops. A
// transport failure moves on to the next endpoint within the caller's deadline; the error then wraps
// errUnavailable. A request etcd refuses for good gives an error with code ErrDatastore.
func (c *etcdClient) txn(ctx context.Context, cmps []compare, success, failure []op) (*txnResult, error) {
	body := appendTxnJSON(nil, cmps, success, failure)
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i := range c.endpoints {
		if ctx.Err() != nil {
			break
		}
		idx := (c.cur + i) % len(c.endpoints)
		res, err := c.post(ctx, idx, body)
		if err == nil {
			c.cur = idx
			return res, nil
		}
		if !errors.Is(err, errUnavailable) {
			return nil, err
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("etcd transaction: %w (%w)", errUnavailable, ctx.Err())
	}
	return nil, errors.Join(errs...)
}

// post sends one transaction to endpoint idx and decodes the answer.
func (c *etcdClient) post(ctx context.Context, idx int, body []byte) (*txnResult, error) {
	ep := c.endpoints[idx]
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	if c.conn != nil && c.conn.endpoint != idx {
		c.conn.close()
		c.conn = nil
	}
	if c.conn == nil {
		conn, err := dialHTTP(ctx, idx, ep, c.tls)
		if err != nil {
			return nil, fmt.Errorf("etcd %s: %w: %w", ep.url, errUnavailable, err)
		}
		c.conn = conn
	}
	c.roundTrips.Add(1)
	status, data, err := c.conn.post(ctx, "/v3/kv/txn", body)
	if err != nil {
		c.conn.close()
		c.conn = nil
		return nil, fmt.Errorf("etcd %s: %w: %w", ep.url, errUnavailable, err)
	}
	if status != 200 {
		var ge gatewayError
		_ = json.Unmarshal(data, &ge)
		if ge.Message == "" {
			ge.Message = strings.TrimSpace(string(data))
		}
		if retryableGRPC(ge.Code) || (status >= 500 && ge.Code == 0) {
			return nil, fmt.Errorf("etcd %s: %w: HTTP %d: %s", ep.url, errUnavailable, status, ge.Message)
		}
		return nil, withCode(ErrDatastore, "etcd %s refused the transaction: HTTP %d: %s", ep.url, status, ge.Message)
	}
	var r txnRespJSON
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, withCode(ErrDatastore, "etcd %s: decoding transaction response: %w", ep.url, err)
	}
	out := &txnResult{Revision: int64(r.Header.Revision), Succeeded: r.Succeeded}
	for _, resp := range r.Responses {
		if resp.Range == nil {
			continue
		}
		kvs := make([]kv, 0, len(resp.Range.Kvs))
		for _, k := range resp.Range.Kvs {
			kvs = append(kvs, kv{Key: string(k.Key), Value: k.Value, CreateRevision: int64(k.CreateRevision), ModRevision: int64(k.ModRevision)})
		}
		out.Ranges = append(out.Ranges, kvs)
	}
	return out, nil
}
