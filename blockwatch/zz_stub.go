// Package blockwatch: TEMPORARY stub of the declared API so that agent/ compiles before the real package
// merges. Deleted on merge.
package blockwatch

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const DefaultHostsPrefix = "/vpp-calico/hosts/"

type Config struct {
	Client             *clientv3.Client
	BlockPrefix        string
	HostsPrefix        string
	PoolPrefix         string
	PageSize           int64
	RequestTimeout     time.Duration
	LegacyHostAffinity bool
	Logger             *slog.Logger
	Registerer         prometheus.Registerer
}

func (c Config) Validate() error { return nil }

type Watcher struct{ ch chan *Snapshot }

func New(cfg Config) (*Watcher, error)           { return &Watcher{ch: make(chan *Snapshot, 1)}, nil }
func (w *Watcher) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (w *Watcher) Updates() <-chan *Snapshot     { return w.ch }
func (w *Watcher) Relist()                       {}
func (w *Watcher) Status() Status                { return Status{} }

type Status struct {
	Synced    bool
	Revision  int64
	LastError string
	Relists   uint64
}

type Snapshot struct {
	Revision      int64
	Blocks        map[netip.Prefix]*Block
	Peers         map[string]Peer
	Pools         map[string]calico.IPPool
	Full          bool
	RelistReason  string
	ChangedBlocks []netip.Prefix
	ChangedPeers  []string
	PoolsChanged  bool
	ReceivedAt    time.Time
}

type Block struct {
	CIDR     netip.Prefix
	Owner    calico.Owner
	Borrowed []calico.Borrowed
}

type Peer struct{ IPv4, IPv6 netip.Addr }

func List(ctx context.Context, cfg Config) (*Snapshot, error) { return nil, nil }
