package cni

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// etcdClient speaks etcd's v3 KV API through the JSON gRPC gateway every etcd v3.4+ member serves on
// its client URL (POST /v3/kv/txn; enabled unless etcd runs with --enable-grpc-gateway=false).
//
// Why not clientv3: a CNI plugin is a process per call, and the clientv3/gRPC/protobuf stack costs
// ~9 ms of start-up per exec on the reference machine (package init and a 22 MB binary), against ~3.5
// ms for net/http. Every call here is one HTTP/1.1 request on one kept-alive connection, so the number
// of requests is the number of etcd round trips, which roundTrips counts.
//
// Only transactions are used: a read is a transaction of range operations, so several reads cost one
// round trip, and every write is a transaction with compares.
type etcdClient struct {
	endpoints []string // base URLs, e.g. "https://10.0.0.1:2379"
	http      *http.Client
	// callTimeout bounds each round trip within the caller's deadline.
	callTimeout time.Duration
	// cur is the index of the endpoint that answered last; tried first.
	cur atomic.Int32
	// roundTrips counts HTTP requests sent to etcd (including failed ones).
	roundTrips atomic.Int64
}

// etcdTLS names the PEM files of an etcd TLS client configuration; all empty means no client
// certificate (https endpoints then verify the server with the system roots).
type etcdTLS struct {
	CACertFile, CertFile, KeyFile string
}

// newEtcdClient returns a client of the endpoints. It opens no connection.
func newEtcdClient(endpoints []string, tlsFiles etcdTLS, callTimeout time.Duration) (*etcdClient, error) {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: callTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// HTTP/1.1 keeps start-up light; one request at a time per process needs nothing more.
		ForceAttemptHTTP2:   false,
		TLSHandshakeTimeout: callTimeout,
	}
	if tlsFiles != (etcdTLS{}) {
		cfg, err := loadTLS(tlsFiles)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	return &etcdClient{endpoints: endpoints, http: &http.Client{Transport: tr}, callTimeout: callTimeout}, nil
}

// loadTLS builds the TLS configuration from PEM files; errors name the file's configuration key.
func loadTLS(f etcdTLS) (*tls.Config, error) {
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

// close releases idle connections.
func (c *etcdClient) close() { c.http.CloseIdleConnections() }

// cmpTarget and cmpResult are the names of etcd's Compare enums in the gateway's JSON.
const (
	targetVersion = "VERSION"
	targetCreate  = "CREATE"
	targetMod     = "MOD"

	resultEqual = "EQUAL"
	resultLess  = "LESS"
)

// compare is one etcd Compare: target(key) result value, over [key, rangeEnd) when rangeEnd is set
// (then every key in the range must satisfy it; an empty range compares as a missing key).
type compare struct {
	Result         string `json:"result,omitempty"`
	Target         string `json:"target,omitempty"`
	Key            []byte `json:"key"`
	RangeEnd       []byte `json:"range_end,omitempty"`
	Version        *int64 `json:"version,omitempty"`
	CreateRevision *int64 `json:"create_revision,omitempty"`
	ModRevision    *int64 `json:"mod_revision,omitempty"`
}

// modRevisionIs requires key's mod revision to be rev (0: the key does not exist).
func modRevisionIs(key string, rev int64) compare {
	return compare{Result: resultEqual, Target: targetMod, Key: []byte(key), ModRevision: &rev}
}

// absent requires key not to exist.
func absent(key string) compare {
	var zero int64
	return compare{Result: resultEqual, Target: targetVersion, Key: []byte(key), Version: &zero}
}

// noneCreatedSince requires that no key under prefix was created after revision rev.
func noneCreatedSince(prefix string, rev int64) compare {
	next := rev + 1
	return compare{Result: resultLess, Target: targetCreate, Key: []byte(prefix), RangeEnd: prefixEnd(prefix), CreateRevision: &next}
}

// op is one request of a transaction: a range read, a put or a delete.
type op struct {
	Range  *rangeReq  `json:"request_range,omitempty"`
	Put    *putReq    `json:"request_put,omitempty"`
	Delete *deleteReq `json:"request_delete_range,omitempty"`
}

type rangeReq struct {
	Key      []byte `json:"key"`
	RangeEnd []byte `json:"range_end,omitempty"`
	KeysOnly bool   `json:"keys_only,omitempty"`
}

type putReq struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

type deleteReq struct {
	Key []byte `json:"key"`
}

func getOp(key string) op { return op{Range: &rangeReq{Key: []byte(key)}} }

func prefixOp(prefix string, keysOnly bool) op {
	return op{Range: &rangeReq{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), KeysOnly: keysOnly}}
}

func putOp(key string, value []byte) op { return op{Put: &putReq{Key: []byte(key), Value: value}} }

func deleteOp(key string) op { return op{Delete: &deleteReq{Key: []byte(key)}} }

// prefixEnd returns the range end that selects every key starting with prefix.
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
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

// gRPC status codes that mean "try again" (Unavailable, DeadlineExceeded, ResourceExhausted, Aborted).
func retryableGRPC(code int) bool { return code == 14 || code == 4 || code == 8 || code == 10 }

// txn runs one transaction: if every compare holds, the success ops, else the failure ops. A
// transport failure moves on to the next endpoint within the caller's deadline; the error then wraps
// errUnavailable. A request etcd refuses for good gives an error with code ErrDatastore.
func (c *etcdClient) txn(ctx context.Context, cmps []compare, success, failure []op) (*txnResult, error) {
	body, err := json.Marshal(struct {
		Compare []compare `json:"compare,omitempty"`
		Success []op      `json:"success,omitempty"`
		Failure []op      `json:"failure,omitempty"`
	}{cmps, success, failure})
	if err != nil {
		return nil, fmt.Errorf("encode etcd transaction: %w", err)
	}
	var errs []error
	start := int(c.cur.Load())
	for i := range c.endpoints {
		if ctx.Err() != nil {
			break
		}
		idx := (start + i) % len(c.endpoints)
		res, err := c.post(ctx, c.endpoints[idx], body)
		if err == nil {
			c.cur.Store(int32(idx))
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

func (c *etcdClient) post(ctx context.Context, endpoint string, body []byte) (*txnResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v3/kv/txn", bytes.NewReader(body))
	if err != nil {
		return nil, withCode(ErrDatastore, "etcd endpoint %s: %w", endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	c.roundTrips.Add(1)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w: %w", endpoint, errUnavailable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: reading response: %w: %w", endpoint, errUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		var ge gatewayError
		_ = json.Unmarshal(data, &ge)
		if ge.Message == "" {
			ge.Message = strings.TrimSpace(string(data))
		}
		if resp.StatusCode >= 500 && (ge.Code == 0 || retryableGRPC(ge.Code)) || retryableGRPC(ge.Code) {
			return nil, fmt.Errorf("etcd %s: %w: HTTP %d: %s", endpoint, errUnavailable, resp.StatusCode, ge.Message)
		}
		return nil, withCode(ErrDatastore, "etcd %s refused the transaction: HTTP %d: %s", endpoint, resp.StatusCode, ge.Message)
	}
	var r txnRespJSON
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, withCode(ErrDatastore, "etcd %s: decoding transaction response: %w", endpoint, err)
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
