// Package vppapi: TEMPORARY stub of the declared API so that agent/ compiles before the real package
// merges. Deleted on merge.
package vppapi

import (
	"context"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"net/netip"
	"time"
)

type Route struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	SwIfIndex uint32
	TableID   uint32
}
type PathType int

const (
	PathNormal PathType = iota
	PathDrop
	PathLocal
)

type FIBEntry struct {
	TableID uint32
	Prefix  netip.Prefix
	Paths   []Path
}
type Path struct {
	NextHop   netip.Addr
	SwIfIndex uint32
	Type      PathType
}
type EventKind int

const (
	Connected EventKind = iota
	Disconnected
	Incompatible
)

type Event struct {
	Kind      EventKind
	PID       uint32
	Version   string
	Restarted bool
	Err       error
}
type Uplink struct {
	Name      string
	SwIfIndex uint32
	HasIndex  bool
	Addresses []netip.Prefix
}
type Op int

const (
	OpAdd Op = iota
	OpDelete
)

type RouteError struct {
	Route Route
	Op    Op
	Err   error
}
type Result struct {
	Added, Deleted int
	Failed         []RouteError
}

func (r Result) Err() error { return nil }

var ErrNotConnected = errors.New("not connected")

type Client struct{}

func (c *Client) Events() <-chan Event                                         { return nil }
func (c *Client) LookupUplink(ctx context.Context, u Uplink) (uint32, error)   { return 0, nil }
func (c *Client) SetupUplink(ctx context.Context, u Uplink) (uint32, error)    { return 0, nil }
func (c *Client) EnsureTable(ctx context.Context, t uint32) error              { return nil }
func (c *Client) DumpRoutes(ctx context.Context, t uint32) ([]FIBEntry, error) { return nil, nil }
func (c *Client) Apply(ctx context.Context, adds, dels []Route) Result         { return Result{} }

type Config struct {
	Socket       string
	ReplyTimeout time.Duration
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

func New(cfg Config) (*Client, error)           { return &Client{}, nil }
func (c *Client) Run(ctx context.Context) error { return nil }
