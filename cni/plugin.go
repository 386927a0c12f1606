package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// CmdAdd implements CNI ADD.
func CmdAdd(args *skel.CmdArgs) error { return run(args, "ADD") }

// CmdDel implements CNI DEL.
func CmdDel(args *skel.CmdArgs) error { return run(args, "DEL") }

// CmdCheck implements CNI CHECK.
func CmdCheck(args *skel.CmdArgs) error { return run(args, "CHECK") }

// CmdGC implements CNI GC.
func CmdGC(args *skel.CmdArgs) error { return run(args, "GC") }

// CmdStatus implements CNI STATUS.
func CmdStatus(args *skel.CmdArgs) error { return run(args, "STATUS") }

// run loads the configuration, sends the one request to the daemon under the configured deadline and
// prints the result. A panic becomes error 999: the runtime must always get protocol output.
func run(args *skel.CmdArgs, verb string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "block-ipam %s: panic: %v\n%s", verb, r, debug.Stack())
			err = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("block-ipam %s: internal error: %v", verb, r)}
		}
	}()
	conf, err := LoadConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	log, closeLog := newLogger(conf)
	defer closeLog()
	if verb == "ADD" {
		// skel refuses the plugin's own netns only after ADD has printed its result, leaking the
		// allocation: refuse it first.
		if o := strings.ToUpper(args.NetnsOverride); o != "TRUE" && o != "1" {
			if own, err := ns.CheckNetNS(args.Netns); err != nil {
				return err
			} else if own {
				return &types.Error{Code: types.ErrInvalidNetNS, Msg: fmt.Sprintf("CNI_NETNS %s is the plugin's own network namespace", args.Netns)}
			}
		}
	}
	timeout := conf.Timeout
	if verb == "STATUS" {
		timeout = StatusTimeout
	}
	req := conf.Request
	req.Verb, req.ContainerID, req.IfName, req.Timeout = verb, args.ContainerID, args.IfName, timeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	start := time.Now()
	attrs := []any{"container", args.ContainerID, "ifname", args.IfName, "network", conf.Network}
	reply, err := Call(ctx, conf.Socket, &req)
	if err != nil {
		err = unreachable(verb, err)
		log.Error(verb+" failed", append(attrs, "err", err)...)
		return err
	}
	attrs = append(attrs, "node", reply.Node, "attempts", reply.Attempts, "batched", reply.Batched,
		"etcd_round_trips", reply.RoundTrips, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	if err := reply.Err(); err != nil {
		log.Error(verb+" failed", append(attrs, "err", err)...)
		return err
	}
	switch verb {
	case "ADD":
		res := conf.Result(reply.Allocations)
		attrs = append(attrs, "ips", resultIPs(res))
		if err := types.PrintResult(res, conf.CNIVersion); err != nil {
			return err
		}
	case "GC":
		attrs = append(attrs, "released", reply.Released)
	}
	log.Info(verb, attrs...)
	return nil
}

// unreachable is the CNI error of a request the daemon did not answer: STATUS says the plugin cannot
// serve ADD (50); every other verb asks the runtime to try again later (11).
func unreachable(verb string, err error) error {
	code := uint(types.ErrTryAgainLater)
	if verb == "STATUS" {
		code = ErrPluginNotAvailable
	}
	if !errors.Is(err, ErrUnreachable) && !errors.Is(err, context.DeadlineExceeded) {
		code = types.ErrInternal
	}
	return &types.Error{Code: code, Msg: err.Error()}
}

// newLogger logs to log_file (appending) or stderr, never stdout: stdout carries the protocol.
func newLogger(c *Config) (*slog.Logger, func()) {
	var w io.Writer = os.Stderr
	closeFn := func() {}
	if c.LogFile != "" {
		f, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			w, closeFn = f, func() { f.Close() }
		} else {
			fmt.Fprintf(os.Stderr, "block-ipam: log_file %s: %v; logging to stderr\n", c.LogFile, err)
		}
	}
	var level slog.Level
	switch c.LogLevel {
	case "debug":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("pid", os.Getpid()), closeFn
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
