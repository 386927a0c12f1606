package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// Defaults of Config (DefaultMaxConnections and DefaultMaxRequestBytes are the socket's limits').
const (
	DefaultCallTimeout  = 5 * time.Second
	DefaultHealthWindow = 30 * time.Second
)

// Config is what the daemon needs; main builds it from flags.
type Config struct {
	// Node is this node's name (calico.CheckNodeName).
	Node string
	// Client is the etcd client; the daemon does not close it.
	Client *clientv3.Client
	// Endpoints names etcd in messages, credentials redacted.
	Endpoints string
	// CallTimeout bounds one etcd round trip (default DefaultCallTimeout).
	CallTimeout time.Duration
	Logger      *slog.Logger
	// Registerer receives the daemon's metrics (nil: none).
	Registerer prometheus.Registerer
	// Pause, when set, runs before every write (tests: kill the daemon or change etcd there).
	Pause func(context.Context)
	// HealthWindow is how long the state loop may go without turning, beyond the deadline of the
	// operation it runs, before /healthz fails (default DefaultHealthWindow).
	HealthWindow time.Duration
	// EtcdHealth, when set, says why etcd cannot serve ("" when it can): then every request is
	// answered at once with that reason, and STATUS and /readyz say not ready.
	EtcdHealth EtcdHealth
	// MaxConnections bounds the socket's connections served at once (default
	// DefaultMaxConnections); MaxRequestBytes the request bytes they buffer in all (default
	// DefaultMaxRequestBytes). See connLimits.
	MaxConnections  int
	MaxRequestBytes int64
	// Observe, when set, receives every request with its reply as it is answered (tests and
	// benchmarks read the daemon's figures of each call here; it must not change them).
	Observe func(*cni.Request, *cni.Reply)
}

// EtcdHealth tells whether etcd serves (etcdconfig.Guard): a frozen etcd keeps the client's connection
// "ready", and one out of space refuses every write, neither of which the connection shows.
type EtcdHealth interface {
	Problem() string
}

// Validate checks the configuration and fills in defaults (the agent's idiom: agent.Config).
func (c *Config) Validate() error {
	if err := calico.CheckNodeName(c.Node); err != nil {
		return fmt.Errorf("--nodename: %w", err)
	}
	if c.Client == nil {
		return errors.New("no etcd client")
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HealthWindow <= 0 {
		c.HealthWindow = DefaultHealthWindow
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	return nil
}
