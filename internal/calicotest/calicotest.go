// Package calicotest writes realistic Calico IPAM data into etcd quickly, for tests, benchmarks and the
// lab. Values are built with package calico, in the form Calico v3.23-v3.31 writes.
package calicotest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// TxnOps is the number of puts PutBlocks sends per transaction (etcd's default limit is 128).
const TxnOps = 128

// MaxBlocks is the number of distinct /26 blocks BlockCIDR can name (10.0.0.0/8).
const MaxBlocks = 1 << 18

// baseSeq is the sequence number every generated block starts at (a fixed time, for reproducible values).
var baseSeq = uint64(time.Date(2024, 5, 2, 10, 0, 0, 0, time.UTC).UnixNano())

// BlockCIDR returns the i-th /26 block of 10.0.0.0/8: 10.0.0.0/26, 10.0.0.64/26, ... (0 <= i < MaxBlocks).
func BlockCIDR(i int) netip.Prefix {
	v := uint32(10)<<24 | uint32(i)<<6
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 26)
}

// Allocate assigns the next free address of b (the head of unallocated) to handle with the given
// secondary attributes, as Calico's IPAM does (reusing an identical attribute, recording the sequence
// number, bumping it), and returns the ordinal; -1 if the block is full.
func Allocate(b *calico.Block, handle string, secondary map[string]string) int {
	if len(b.Unallocated) == 0 {
		return -1
	}
	ord := b.Unallocated[0]
	b.Unallocated = b.Unallocated[1:]
	idx := -1
	for i, a := range b.Attributes {
		if a.Handle() == handle && maps.Equal(a.Secondary, secondary) {
			idx = i
			break
		}
	}
	if idx < 0 {
		h := handle
		b.Attributes = append(b.Attributes, calico.AllocationAttribute{HandleID: &h, Secondary: secondary})
		idx = len(b.Attributes) - 1
	}
	b.Allocations[ord] = &idx
	if b.SequenceNumberForAllocation == nil {
		b.SequenceNumberForAllocation = map[string]uint64{}
	}
	b.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.SequenceNumber
	b.SequenceNumber++
	return ord
}

// PodAttrs returns the secondary attributes Calico's CNI plugin writes for a pod on node.
func PodAttrs(node, namespace, pod string, ts time.Time) map[string]string {
	return map[string]string{
		calico.AttrNamespace: namespace, calico.AttrNode: node, calico.AttrPod: pod,
		calico.AttrTimestamp: ts.UTC().String(),
	}
}

// Block returns a realistic block for cidr owned by node ("" for a block without owner): the node's
// VXLAN tunnel address and two pods, each with its own handle; i varies the handles and pod names.
func Block(cidr netip.Prefix, node string, i int) *calico.Block {
	aff := ""
	if node != "" {
		aff = "host:" + node
	}
	b := calico.NewBlock(cidr, aff, baseSeq+uint64(i)*1000)
	if node == "" {
		return b
	}
	Allocate(b, "vxlan-tunnel-addr-"+node, map[string]string{calico.AttrNode: node, "type": "vxlanTunnelAddress"})
	ts := time.Unix(0, int64(b.SequenceNumber)).UTC()
	for p := range 2 {
		Allocate(b, fmt.Sprintf("k8s-pod-network.%064x", uint64(i)<<8|uint64(p)),
			PodAttrs(node, "default", fmt.Sprintf("web-%d-%d", i, p), ts.Add(time.Duration(p)*time.Second)))
	}
	return b
}

// PutBlocks writes n blocks, BlockCIDR(0) to BlockCIDR(n-1), the i-th built by Block and owned by
// ownerOf(i), under calico.BlockPrefix, in transactions of TxnOps puts (a few in flight), and returns
// their CIDRs.
func PutBlocks(ctx context.Context, cli *clientv3.Client, n int, ownerOf func(i int) string) ([]netip.Prefix, error) {
	if n < 0 || n > MaxBlocks {
		return nil, fmt.Errorf("put %d blocks: want 0 to %d", n, MaxBlocks)
	}
	cidrs := make([]netip.Prefix, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for start := 0; start < n; start += TxnOps {
		end := min(start+TxnOps, n)
		ops := make([]clientv3.Op, 0, end-start)
		for i := start; i < end; i++ {
			cidrs[i] = BlockCIDR(i)
			v, err := calico.EncodeBlock(Block(cidrs[i], ownerOf(i), i))
			if err != nil {
				return nil, fmt.Errorf("encode block %s: %w", cidrs[i], err)
			}
			ops = append(ops, clientv3.OpPut(calico.BlockKey(cidrs[i]), string(v)))
		}
		g.Go(func() error {
			if _, err := cli.Txn(gctx).Then(ops...).Commit(); err != nil {
				return fmt.Errorf("put blocks %d to %d: %w", start, end-1, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return cidrs, nil
}

// PutBlock writes one block value under calico.BlockPrefix.
func PutBlock(ctx context.Context, cli *clientv3.Client, b *calico.Block) error {
	v, err := calico.EncodeBlock(b)
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, calico.BlockKey(b.CIDR), string(v)); err != nil {
		return fmt.Errorf("put block %s: %w", b.CIDR, err)
	}
	return nil
}

// PeerKey returns the key of node's peer IP of addr's family under prefix: the format of
// blockwatch.PeerKey (<prefix><node>/peerip/ipv4/1 or .../ipv6/1), repeated here so that blockwatch's
// own tests can import this package.
func PeerKey(prefix, node string, addr netip.Addr) string {
	return prefix + node + "/peerip/" + netaddr.FamilyOf(addr).String() + "/1"
}

// PutPeer registers addr as node's peer IP under prefix (blockwatch.DefaultHostsPrefix in production).
func PutPeer(ctx context.Context, cli *clientv3.Client, prefix, node string, addr netip.Addr) error {
	if _, err := cli.Put(ctx, PeerKey(prefix, node, addr), addr.Unmap().String()); err != nil {
		return fmt.Errorf("put peer %s of %s: %w", addr, node, err)
	}
	return nil
}

// PutPool stores p as the Calico IPPool resource calicoctl would write.
func PutPool(ctx context.Context, cli *clientv3.Client, p calico.IPPool) error {
	v, err := calico.EncodeIPPool(p)
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, calico.IPPoolKey(p.Name), string(v)); err != nil {
		return fmt.Errorf("put IP pool %s: %w", p.Name, err)
	}
	return nil
}
