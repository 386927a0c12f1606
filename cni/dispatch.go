package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// ServeFrame answers one call of the plugin: frame carries the CNI environment and stdin as the
// runtime gave them, and the reply frame what the plugin prints, its exit code and its log line.
// It does what skel did in the plugin (the environment, the configuration's name and CNI version, the
// version each verb needs, the plugin's own netns after ADD and DEL), then what the plugin's verbs did
// (LoadConfig, the request, the result in the configuration's CNI version), with the same codes and
// messages: a runtime sees the same bytes. A frame over shim.MaxFrame (serveConn reads one byte
// more) is refused with 7. do serves the request; it is called only for a call that
// passed every check, so that a bad configuration fails before any etcd work.
func ServeFrame(frame []byte, do func(*Request) *Reply) (out []byte) {
	fc := &frameCall{}
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "block-ipam: panic serving %s: %v\n%s", fc.env("CNI_COMMAND"), r, debug.Stack())
			out = fc.reply(nil, &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("block-ipam %s: internal error: %v", fc.env("CNI_COMMAND"), r)})
		}
	}()
	if len(frame) > shim.MaxFrame {
		return fc.reply(nil, &types.Error{Code: types.ErrInvalidNetworkConfig,
			Msg: fmt.Sprintf("block-ipam daemon: the plugin's request is larger than %d bytes: the network configuration is too large", shim.MaxFrame)})
	}
	rec, err := shim.ParseFrame(frame)
	if err != nil {
		return fc.reply(nil, &types.Error{Code: types.ErrDecodingFailure, Msg: "block-ipam daemon: the plugin's request: " + err.Error()})
	}
	fc.rec = rec
	stdout, terr := fc.pluginMain(do)
	return fc.reply(stdout, terr)
}

// frameCall is one call of the plugin.
type frameCall struct {
	rec map[string][]byte
	// served is the daemon's reply, nil when the call did not reach it: its figures go in the
	// reply frame.
	served *Reply
	// log is the call's log line, which the plugin appends to its log_file.
	log bytes.Buffer
}

func (fc *frameCall) env(name string) string { return string(fc.rec[name]) }

// reply encodes the reply frame: the result, or the error as skel prints it.
func (fc *frameCall) reply(stdout []byte, err *types.Error) []byte {
	exit := "0"
	if err != nil {
		exit = "1"
		stdout, _ = json.MarshalIndent(err, "", "    ")
	}
	out := shim.AppendRecord(nil, shim.KeyExit, []byte(exit))
	out = shim.AppendRecord(out, shim.KeyStdout, stdout)
	if fc.log.Len() > 0 {
		out = shim.AppendRecord(out, shim.KeyLog, fc.log.Bytes())
	}
	if r := fc.served; r != nil {
		out = shim.AppendRecord(out, shim.KeyNode, []byte(r.Node))
		out = shim.AppendRecord(out, shim.KeyAttempts, strconv.AppendInt(nil, int64(r.Attempts), 10))
		out = shim.AppendRecord(out, shim.KeyBatched, strconv.AppendInt(nil, int64(r.Batched), 10))
		out = shim.AppendRecord(out, shim.KeyRoundTrips, strconv.AppendInt(nil, r.RoundTrips, 10))
		out = shim.AppendRecord(out, shim.KeyReleased, strconv.AppendInt(nil, int64(r.Released), 10))
	}
	return shim.Seal(out)
}

// pluginMain is skel's PluginMainFuncs (containernetworking/cni v1.3.0) around the verbs.
func (fc *frameCall) pluginMain(do func(*Request) *Reply) ([]byte, *types.Error) {
	cmd, serr := shim.CheckEnv(fc.env)
	if serr != nil {
		return nil, &types.Error{Code: serr.Code, Msg: serr.Msg, Details: serr.Details}
	}
	if cmd == "VERSION" {
		return []byte(shim.VersionJSON()), nil
	}
	stdin := fc.rec[shim.KeyStdin]
	if err := validateConfig(stdin); err != nil {
		return nil, err
	}
	if serr := shim.CheckVersion(cmd, stdin); serr != nil {
		return nil, &types.Error{Code: serr.Code, Msg: serr.Msg, Details: serr.Details}
	}
	stdout, err := fc.run(cmd, stdin, do)
	if err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return nil, te
		}
		return nil, types.NewError(types.ErrInternal, err.Error(), "")
	}
	if cmd == "DEL" {
		// skel's check after DEL: the release is done (DEL never needs the netns), the call fails.
		switch ns := fc.env(shim.KeyNetNS); {
		case ns == shim.NetNSOwn:
			return nil, types.NewError(types.ErrInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", "")
		case ns != "" && ns != shim.NetNSOther:
			return nil, types.NewError(types.ErrInvalidNetNS, "get plugin's netns failed", "")
		}
	}
	return stdout, nil
}

// validateConfig is skel's check of stdin before any verb.
func validateConfig(stdin []byte) *types.Error {
	var conf struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
	}
	if conf.Name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	return utils.ValidateNetworkName(conf.Name)
}

// run is the plugin's verb: load the configuration, ask the daemon (do), render the result for the
// configuration's CNI version, and log the call.
func (fc *frameCall) run(verb string, stdin []byte, do func(*Request) *Reply) ([]byte, error) {
	conf, err := loadConfig(verb, stdin, fc.env("CNI_ARGS"), fc.resolvConf)
	if err != nil {
		return nil, err
	}
	pid, _ := strconv.Atoi(fc.env(shim.KeyPID))
	log := newLogger(&fc.log, conf.LogLevel, pid)
	if verb == "ADD" {
		// skel refuses the plugin's own netns only after ADD has printed its result, leaking the
		// allocation: refuse it first.
		switch ns := fc.env(shim.KeyNetNS); {
		case ns == shim.NetNSOwn:
			return nil, &types.Error{Code: types.ErrInvalidNetNS, Msg: fmt.Sprintf("CNI_NETNS %s is the plugin's own network namespace", fc.env("CNI_NETNS"))}
		case ns != "" && ns != shim.NetNSOther:
			// skel's words, without the plugin's reason (ns), as skel prints it.
			return nil, types.NewError(types.ErrInvalidNetNS, "get plugin's netns failed", "")
		}
	}
	timeout := conf.Timeout
	if verb == "STATUS" {
		timeout = StatusTimeout
	}
	req := conf.Request
	req.ContainerID, req.IfName, req.Timeout = fc.env("CNI_CONTAINERID"), fc.env("CNI_IFNAME"), timeout

	start := time.Now()
	attrs := []any{"container", req.ContainerID, "ifname", req.IfName, "network", conf.Network}
	reply := do(&req)
	fc.served = reply
	attrs = append(attrs, "node", reply.Node, "attempts", reply.Attempts, "batched", reply.Batched,
		"etcd_round_trips", reply.RoundTrips, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	if err := reply.Err(); err != nil {
		log.Error(verb+" failed", append(attrs, "err", err)...)
		return nil, err
	}
	var stdout []byte
	switch verb {
	case "ADD":
		res := conf.Result(reply.Allocations)
		attrs = append(attrs, "ips", resultIPs(res))
		r, err := res.GetAsVersion(conf.CNIVersion)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if err := r.PrintTo(&buf); err != nil {
			return nil, err
		}
		stdout = buf.Bytes()
	case "GC":
		attrs = append(attrs, "released", reply.Released)
	}
	log.Info(verb, attrs...)
	return stdout, nil
}

// resolvConf returns the resolvConf file as the plugin read it.
func (fc *frameCall) resolvConf(path string) ([]byte, error) {
	if msg, ok := fc.rec[shim.KeyResolvConfErr]; ok {
		return nil, errors.New(string(msg))
	}
	data, ok := fc.rec[shim.KeyResolvConf]
	if !ok {
		return nil, fmt.Errorf("the plugin did not send %s", path)
	}
	return data, nil
}

// ErrorFrame is the reply frame of a call the daemon refuses before reading it whole (too busy).
func ErrorFrame(err *types.Error) []byte {
	return (&frameCall{}).reply(nil, err)
}
