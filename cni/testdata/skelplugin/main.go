// Command skelplugin is block-ipam's plugin as it was before the thin shim (package cni/shim): skel's
// checks, cni.LoadConfig and the result's rendering in the plugin, with only the allocation asked of
// the daemon (package ipamcall, which reads its addresses and code back from the daemon's frame). The
// shim's tests run both against one daemon and compare what they print.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

func main() {
	cmd := func(verb string) func(*skel.CmdArgs) error {
		return func(args *skel.CmdArgs) error { return run(args, verb) }
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmd("ADD"), Del: cmd("DEL"), Check: cmd("CHECK"), GC: cmd("GC"), Status: cmd("STATUS")},
		version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0"), "CNI block-ipam dev")
}

// run loads the configuration, sends the one request to the daemon under the configured deadline and
// prints the result. A panic becomes error 999: the runtime must always get protocol output.
func run(args *skel.CmdArgs, verb string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "block-ipam %s: panic: %v\n%s", verb, r, debug.Stack())
			err = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("block-ipam %s: internal error: %v", verb, r)}
		}
	}()
	conf, err := cni.LoadConfig(verb, args.StdinData, args.Args)
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
		timeout = cni.StatusTimeout
	}
	req := conf.Request
	req.ContainerID, req.IfName, req.Timeout = args.ContainerID, args.IfName, timeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	start := time.Now()
	attrs := []any{"container", args.ContainerID, "ifname", args.IfName, "network", conf.Network}
	env := map[string]string{"CNI_COMMAND": verb, "CNI_CONTAINERID": args.ContainerID, "CNI_IFNAME": args.IfName,
		"CNI_NETNS": args.Netns, "CNI_ARGS": args.Args, "CNI_PATH": args.Path}
	if verb == "ADD" {
		if err := addResolvConf(env, args.StdinData); err != nil {
			return err
		}
	}
	reply, err := ipamcall.Do(ctx, conf.Socket, env, args.StdinData)
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
		code = cni.ErrPluginNotAvailable
	}
	if !errors.Is(err, ipamcall.ErrUnreachable) && !errors.Is(err, context.DeadlineExceeded) {
		code = types.ErrInternal
	}
	return &types.Error{Code: code, Msg: err.Error()}
}

// addResolvConf hands the daemon the content of ipam.resolvConf, as the shim does (LoadConfig has
// read it already: it exists).
func addResolvConf(env map[string]string, stdin []byte) error {
	var n cni.NetConf
	if err := json.Unmarshal(stdin, &n); err != nil || n.IPAM == nil || n.IPAM.ResolvConf == "" {
		return err
	}
	data, err := os.ReadFile(n.IPAM.ResolvConf)
	if err != nil {
		return err
	}
	env[shim.KeyResolvConf] = string(data)
	return nil
}

// newLogger logs to log_file (appending) or stderr, never stdout: stdout carries the protocol.
func newLogger(c *cni.Config) (*slog.Logger, func()) {
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

func resultIPs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, ",")
}
