package vppapi

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultSocket         = "/run/vpp/api.sock"
	DefaultReplyTimeout   = 2 * time.Second
	DefaultReconnectDelay = 250 * time.Millisecond
	DefaultWindow         = 256
	DefaultHealthInterval = time.Second

	// MaxWindow bounds Config.Window: the in-flight requests of one Apply must fit in the socket buffers
	// and far below GoVPP's 16-bit sequence space.
	MaxWindow = 4096

	// maxReconnectDelay caps the reconnect backoff.
	maxReconnectDelay = 5 * time.Second
	// maxSocketPath is the usable length of a unix socket path (sun_path is 108 bytes with its NUL).
	maxSocketPath = 107
)

// Config configures a Client. Zero fields take the defaults above.
type Config struct {
	// Socket is VPP's binary API socket; default /run/vpp/api.sock.
	Socket string
	// ReplyTimeout bounds every single request: no reply (or, inside a dump or a pipelined Apply, no
	// further reply) within it fails the request. Default 2s.
	ReplyTimeout time.Duration
	// ReconnectDelay is the first reconnect backoff step; the backoff doubles, is jittered and is capped
	// at 5s. Default 250ms.
	ReconnectDelay time.Duration
	// Window is how many route requests Apply keeps in flight on its stream; the stream's reply buffer is
	// sized to it so GoVPP never drops a reply. Default 256, at most MaxWindow.
	Window int
	// HealthInterval is how often Run probes a connected VPP with control_ping. A probe that fails to
	// send, or two consecutive probes without a reply while no other reply arrives, end the connection.
	// Default 1s.
	HealthInterval time.Duration
	// Logger receives connection state changes and errors; nil discards them.
	Logger *slog.Logger
	// Registerer, if not nil, receives the package's metrics (see metrics.go).
	Registerer prometheus.Registerer
}

// Validate reports every invalid field of c. Zero values are valid: they mean "use the default".
func (c Config) Validate() error {
	var errs []error
	if len(c.Socket) > maxSocketPath {
		errs = append(errs, fmt.Errorf("socket path %q is %d bytes, longer than the %d a unix socket allows",
			c.Socket, len(c.Socket), maxSocketPath))
	}
	if c.ReplyTimeout < 0 {
		errs = append(errs, fmt.Errorf("reply timeout %v is negative", c.ReplyTimeout))
	}
	if c.ReconnectDelay < 0 {
		errs = append(errs, fmt.Errorf("reconnect delay %v is negative", c.ReconnectDelay))
	}
	if c.ReconnectDelay > maxReconnectDelay {
		errs = append(errs, fmt.Errorf("reconnect delay %v is above the %v backoff cap", c.ReconnectDelay, maxReconnectDelay))
	}
	if c.Window < 0 || c.Window > MaxWindow {
		errs = append(errs, fmt.Errorf("window %d is outside 1..%d", c.Window, MaxWindow))
	}
	if c.HealthInterval < 0 {
		errs = append(errs, fmt.Errorf("health interval %v is negative", c.HealthInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid vppapi config: %w", err)
	}
	return nil
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.ReplyTimeout == 0 {
		c.ReplyTimeout = DefaultReplyTimeout
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = DefaultReconnectDelay
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
