// Package ipamcall calls block-ipam's node daemon over its socket the way the plugin (package
// cni/shim) does, with one frame, and reads the reply frame back into a cni.Reply: tests and
// benchmarks use it as their client. The figures the daemon reports per call
// (its node, attempts, batched requests, etcd round trips, GC's releases) come from records of the
// reply frame; the allocations from the result it rendered.
package ipamcall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// ErrUnreachable marks a daemon that could not be asked or did not answer: nothing is known about the
// operation's outcome.
var ErrUnreachable = errors.New("block-ipam daemon unreachable")

// Call sends req to the daemon listening on socket as the plugin would (Frame), within ctx's
// deadline, and returns its reply. The allocations' Block is the block (the configuration asks for
// result_prefix "block").
func Call(ctx context.Context, socket string, req *cni.Request) (*cni.Reply, error) {
	env, stdin, err := Frame(req)
	if err != nil {
		return nil, err
	}
	return Do(ctx, socket, env, stdin)
}

// Frame returns the CNI environment and the network configuration of a call that makes the daemon
// serve req: the per-network settings the tests use become the ipam section (assign_ipv4 and
// assign_ipv6 are left to their defaults when req assigns nothing and is not an ADD), the
// attachments of GC its cni.dev/valid-attachments. The other settings are refused.
func Frame(req *cni.Request) (env map[string]string, stdin []byte, err error) {
	if len(req.PrevIPs) > 0 || len(req.RequestedIPs) > 0 || len(req.Exclude) > 0 || req.MaxBlocks != 0 || req.Namespace != "" || req.Pod != "" {
		return nil, nil, errors.New("ipamcall: a request's PrevIPs, RequestedIPs, Exclude, MaxBlocks, Namespace and Pod are not supported")
	}
	env = map[string]string{"CNI_COMMAND": req.Verb, "CNI_PATH": "/opt/cni/bin"}
	if req.ContainerID != "" {
		env["CNI_CONTAINERID"] = req.ContainerID
	}
	if req.IfName != "" {
		env["CNI_IFNAME"] = req.IfName
	}
	switch req.Verb {
	case "ADD", "DEL", "CHECK":
		env["CNI_NETNS"] = "/var/run/netns/test"
	}

	ipam := map[string]any{"type": "block-ipam", "result_prefix": "block"}
	if req.Verb == "ADD" || req.Assign != [2]bool{} {
		// Only ADD reads them; a configuration assigning nothing is refused whatever the verb.
		ipam["assign_ipv4"], ipam["assign_ipv6"] = strconv.FormatBool(req.Assign[netaddr.V4]), strconv.FormatBool(req.Assign[netaddr.V6])
	}
	if req.Node != "" {
		ipam["nodename"] = req.Node
	}
	for f, key := range []string{"ipv4_pools", "ipv6_pools"} {
		if req.Pools[f] == nil {
			continue
		}
		pools := []string{}
		for _, p := range req.Pools[f] {
			if p.Name != "" {
				pools = append(pools, p.Name)
			} else {
				pools = append(pools, p.CIDR.String())
			}
		}
		ipam[key] = pools
	}
	if req.Timeout > 0 {
		ipam["timeout"] = req.Timeout.String()
	}
	conf := map[string]any{"cniVersion": "1.1.0", "name": req.Network, "ipam": ipam}
	if req.HaveAttachments {
		valid := req.ValidAttachments
		if valid == nil {
			valid = []types.GCAttachment{}
		}
		conf["cni.dev/valid-attachments"] = valid
	}
	stdin, err = json.Marshal(conf)
	return env, stdin, err
}

// Do sends the call of env and stdin (the network configuration) to the daemon on socket in one frame
// and reads the reply frame: the CNI error's code and message, ADD's allocations from the result,
// and the daemon's figures of the call. An error wraps ErrUnreachable when the daemon could not
// be reached or died before answering.
func Do(ctx context.Context, socket string, env map[string]string, stdin []byte) (*cni.Reply, error) {
	var frame []byte
	for k, v := range env {
		frame = shim.AppendRecord(frame, k, []byte(v))
	}
	frame = shim.Seal(shim.AppendRecord(frame, shim.KeyStdin, stdin))
	data, err := exchange(ctx, socket, frame)
	if err != nil {
		return nil, err
	}
	rec, err := shim.ParseFrame(data)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: reply %.200q: %w", ErrUnreachable, socket, data, err)
	}
	reply := &cni.Reply{}
	stdout := rec[shim.KeyStdout]
	switch exit := string(rec[shim.KeyExit]); exit {
	case "0":
		if env["CNI_COMMAND"] == "ADD" {
			if reply.Allocations, err = allocations(stdout); err != nil {
				return nil, fmt.Errorf("block-ipam daemon at %s: result %s: %w", socket, stdout, err)
			}
		}
	case "1":
		var te types.Error
		if err := json.Unmarshal(stdout, &te); err != nil || te.Code == 0 {
			return nil, fmt.Errorf("block-ipam daemon at %s: undecodable error %.200q: %v", socket, stdout, err)
		}
		reply.Code, reply.Msg = te.Code, te.Msg
	default:
		return nil, fmt.Errorf("block-ipam daemon at %s: exit code %q", socket, exit)
	}
	if err := figures(rec, reply); err != nil {
		return nil, fmt.Errorf("block-ipam daemon at %s: %w", socket, err)
	}
	return reply, nil
}

// allocations reads the addresses of a result, in whatever CNI version it was rendered.
func allocations(stdout []byte) ([]cni.Allocation, error) {
	r, err := create.CreateFromBytes(stdout)
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	var out []cni.Allocation
	for _, ip := range res.IPs {
		p, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, fmt.Errorf("address %v", ip.Address.IP)
		}
		ones, _ := ip.Address.Mask.Size()
		p = p.Unmap()
		out = append(out, cni.Allocation{Addr: p, Block: netip.PrefixFrom(p, ones).Masked()})
	}
	return out, nil
}

// figures reads the daemon's figures of the call from the reply frame into reply.
func figures(rec map[string][]byte, reply *cni.Reply) error {
	reply.Node = string(rec[shim.KeyNode])
	for key, into := range map[string]func(int64){
		shim.KeyAttempts:   func(n int64) { reply.Attempts = int(n) },
		shim.KeyBatched:    func(n int64) { reply.Batched = int(n) },
		shim.KeyRoundTrips: func(n int64) { reply.RoundTrips = n },
		shim.KeyReleased:   func(n int64) { reply.Released = int(n) },
	} {
		v, ok := rec[key]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("reply's %s %q: %w", key, v, err)
		}
		into(n)
	}
	return nil
}

// exchange writes frame to the daemon and reads the reply, within ctx; closing the connection early
// is the plugin's hang-up.
func exchange(ctx context.Context, socket string, frame []byte) ([]byte, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write(frame); err != nil {
		return nil, fmt.Errorf("%w at %s: sending the request: %w", ErrUnreachable, socket, err)
	}
	data, err := io.ReadAll(io.LimitReader(conn, shim.MaxFrame+1))
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%w at %s: waiting for the reply: %w", ErrUnreachable, socket, err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w at %s: the daemon closed the connection without a reply", ErrUnreachable, socket)
	}
	if len(data) > shim.MaxFrame {
		return nil, fmt.Errorf("block-ipam daemon at %s: reply larger than %d bytes", socket, shim.MaxFrame)
	}
	return data, nil
}
