package cni

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Group commit. When many ADDs of one node run at once (a node starting 100 pods), each would hold
// the node lock for one etcd write in turn. Instead, an ADD that has to wait leaves a request in a
// queue directory beside the lock; the process holding the lock, when it assigns from the
// remembered block, also assigns to every compatible pending request that fits, writes all their
// handles in its one transaction (each conditional on being absent), and leaves each a result file.
// A served process then finds its result as soon as it holds the lock and answers without touching
// etcd.
//
// Nothing depends on the queue for correctness: the transaction is all or nothing; a result is
// written only after it committed and only for the process that asked (a nonce); a process that finds
// no result withdraws its request and allocates itself, and if a leader died between its commit and
// its result files, that process's own ADD finds its handle and returns the committed addresses
// (ADD is idempotent). Requests of dead processes are discarded.

const (
	// maxBatch bounds the requests one leader serves besides its own.
	maxBatch = 30
	// staleQueueFile is the age after which leftover queue files are removed.
	staleQueueFile = 10 * time.Minute
)

// batchRequest is a waiting ADD, as written in the queue.
type batchRequest struct {
	// Key must equal the leader's batchKey: same node, etcd, network and allocation settings.
	Key    string                     `json:"key"`
	Nonce  string                     `json:"nonce"`
	PID    int                        `json:"pid"`
	Handle string                     `json:"handle"`
	Attr   calico.AllocationAttribute `json:"attr"`

	path   string
	allocs []allocation
}

// batchResult is what a leader leaves for a served request.
type batchResult struct {
	Nonce  string        `json:"nonce"`
	Allocs []resultAlloc `json:"allocs"`
}

type resultAlloc struct {
	Block netip.Prefix `json:"block"`
	Addr  netip.Addr   `json:"addr"`
}

// queueDir is the queue beside the lock file; "" (no lock) disables group commit.
func queueDir(lockFile string) string {
	if lockFile == "" {
		return ""
	}
	return lockFile + ".queue"
}

// batchKey fingerprints everything an allocation depends on besides etcd.
func (c *Config) batchKey() string {
	return fmt.Sprintf("%s|%s|%v|%v", c.cacheKey(), c.Network, c.Exclude, c.Assign)
}

// enqueue writes this ADD's request into the queue; nil when group commit is off or the queue cannot
// be written (the ADD then simply allocates itself).
func (c *call) enqueue(handle, ifname string) *batchRequest {
	dir := queueDir(c.conf.LockFile)
	if dir == "" || len(c.conf.RequestedIPs) > 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	r := &batchRequest{Key: c.conf.batchKey(), Nonce: hex.EncodeToString(nonce[:]), PID: os.Getpid(), Handle: handle,
		Attr: c.attribute(handle, ifname), path: filepath.Join(dir, queueName(handle, ifname)+".req")}
	os.Remove(resultPath(r.path)) // a result left for an earlier process of this container is not ours
	data, err := json.Marshal(r)
	if err != nil || os.WriteFile(r.path, data, 0o600) != nil {
		return nil
	}
	return r
}

// queueName is a file name for a (handle, interface): both are CNI-validated ([a-zA-Z0-9_.-]).
func queueName(handle, ifname string) string { return handle + "@" + ifname }

func resultPath(reqPath string) string { return strings.TrimSuffix(reqPath, ".req") + ".res" }

// served returns the allocations a leader left for this request, and withdraws the request either
// way. Call it with the node lock held.
func (r *batchRequest) served() ([]allocation, bool) {
	defer os.Remove(r.path)
	res := resultPath(r.path)
	data, err := os.ReadFile(res)
	if err != nil {
		return nil, false
	}
	os.Remove(res)
	var br batchResult
	if json.Unmarshal(data, &br) != nil || br.Nonce != r.Nonce || len(br.Allocs) == 0 {
		return nil, false
	}
	out := make([]allocation, len(br.Allocs))
	for i, a := range br.Allocs {
		out[i] = allocation{block: a.Block, addr: a.Addr}
	}
	return out, true
}

// withdraw removes the request (a process that gives up, or that allocates itself).
func (r *batchRequest) withdraw() {
	if r != nil {
		os.Remove(r.path)
	}
}

// pending returns up to maxBatch compatible requests of live processes waiting in the queue, and
// removes leftovers of dead ones. Call it with the node lock held.
func (c *call) pending() []*batchRequest {
	dir := queueDir(c.conf.LockFile)
	if dir == "" {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	key := c.conf.batchKey()
	var out []*batchRequest
	seen := map[string]bool{}
	for _, de := range entries {
		name := de.Name()
		path := filepath.Join(dir, name)
		if strings.HasSuffix(name, ".res") {
			if info, err := de.Info(); err == nil && time.Since(info.ModTime()) > staleQueueFile {
				os.Remove(path)
			}
			continue
		}
		if !strings.HasSuffix(name, ".req") || len(out) >= maxBatch {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var r batchRequest
		if json.Unmarshal(data, &r) != nil || r.PID <= 0 {
			continue // being written, or garbage: its process will allocate itself
		}
		if !alive(r.PID) {
			os.Remove(path)
			continue
		}
		if r.Key != key || r.PID == os.Getpid() || seen[r.Handle] || !strings.HasPrefix(r.Handle, c.conf.Network+".") {
			continue
		}
		seen[r.Handle] = true
		r.path = path
		out = append(out, &r)
	}
	return out
}

// alive reports whether a process exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// serveBatch assigns, after the leader's own assignment, one address per family to as many pending
// requests as the view's blocks have room for, and returns those it served.
func (v *view) serveBatch(reqs []*batchRequest) []*batchRequest {
	var served []*batchRequest
	for _, r := range reqs {
		if r.Handle == v.handleID {
			continue
		}
		allocs, _, ok := v.assignCurrent(r.Attr)
		if !ok {
			break
		}
		r.allocs = allocs
		served = append(served, r)
	}
	return served
}

// answer leaves each served request its result, after the commit that made it true.
func (c *call) answer(served []*batchRequest) {
	for _, r := range served {
		res := batchResult{Nonce: r.Nonce}
		for _, a := range r.allocs {
			res.Allocs = append(res.Allocs, resultAlloc{Block: a.block, Addr: a.addr})
		}
		data, err := json.Marshal(res)
		if err == nil {
			err = os.WriteFile(resultPath(r.path), data, 0o600)
		}
		if err != nil {
			c.log.Warn("cannot leave a batched result; that ADD will find its handle itself", "handle", r.Handle, "err", err)
			continue
		}
		os.Remove(r.path)
	}
}
