package cni

import (
	"io"
	"log/slog"
	"net"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// newLogger is the plugin's logger for one call: slog's text, with the plugin's pid, at the
// configured level. The daemon renders the line and the plugin appends it to log_file or stderr,
// never stdout: stdout carries the protocol.
func newLogger(w io.Writer, level string, pid int) *slog.Logger {
	var l slog.Level
	switch level {
	case "debug":
		l = slog.LevelDebug
	case "warn", "warning":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})).With("pid", pid)
}

// Result builds the CNI result for the allocations: host prefixes (or the block's mask), the family's
// gateway, the configured routes and DNS.
func (c *Config) Result(allocs []Allocation) *current.Result {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: c.Routes, DNS: c.DNS}
	for _, a := range allocs {
		bits := a.Addr.BitLen()
		if c.ResultBlock {
			bits = a.Block.Bits()
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: net.IP(a.Addr.AsSlice()), Mask: net.CIDRMask(bits, a.Addr.BitLen())}}
		if gw := c.Gateways[FamilyOf(a.Addr)]; gw.IsValid() {
			ipc.Gateway = net.IP(gw.AsSlice())
		}
		res.IPs = append(res.IPs, ipc)
	}
	return res
}

func resultIPs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, ",")
}
