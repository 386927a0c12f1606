package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// Call is one CNI call of the plugin, decoded from its frame and checked: the daemon's front door.
// The daemon's request path reads Decode -> serve Call.Request -> Call.Render, with typed values:
// every CNI rule is checked here, once, where the request enters, with the CNI library's
// validators; the codes are the spec's, the messages block-ipam's own.
type Call struct {
	// Config is the call's configuration; its Request, with the call's verb, container, interface
	// and timeout, is what the daemon serves.
	Config *Config

	start time.Time
	// netns is the plugin's verdict on CNI_NETNS (shim.KeyNetNS), "" when it did not look.
	netns string
	pid   int
}

// Request is the operation the call asks of the daemon.
func (c *Call) Request() *Request { return &c.Config.Request }

// requiredEnv are the CNI environment variables and the verbs that need them (skel's, the CNI
// library's v1.3.0: CNI_PATH for every verb, CNI_NETNS optional for DEL).
var requiredEnv = []struct {
	name  string
	verbs string
}{
	{"CNI_COMMAND", "ADD CHECK DEL GC STATUS"},
	{"CNI_CONTAINERID", "ADD CHECK DEL"},
	{"CNI_NETNS", "ADD CHECK"},
	{"CNI_IFNAME", "ADD CHECK DEL"},
	{"CNI_PATH", "ADD CHECK DEL GC STATUS"},
}

// minVersion is the configuration's lowest cniVersion each verb allows, "" for any: the verbs a
// plugin of spec 1.1 serves.
var minVersion = map[string]string{"ADD": "", "DEL": "", "CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}

// Decode reads the plugin's frame (the CNI environment and stdin as the runtime gave them) and
// checks the call: the environment (4), the configuration's JSON (6), its name (7), its cniVersion
// against the verb and block-ipam's versions (1), every setting (7 naming the field), CNI_ARGS (4),
// and the plugin's own netns for ADD (8, refused before anything is allocated; skel refused it only
// after printing the result). It opens no connection.
func Decode(frame []byte) (*Call, *types.Error) {
	if len(frame) > shim.MaxFrame {
		return nil, &types.Error{Code: types.ErrInvalidNetworkConfig,
			Msg: fmt.Sprintf("block-ipam daemon: the plugin's request is larger than %d bytes: the network configuration is too large", shim.MaxFrame)}
	}
	rec, err := shim.ParseFrame(frame)
	if err != nil {
		return nil, &types.Error{Code: types.ErrDecodingFailure, Msg: "block-ipam daemon: the plugin's request: " + err.Error()}
	}
	env := func(name string) string { return string(rec[name]) }
	verb := env("CNI_COMMAND")
	if err := checkEnv(verb, env); err != nil {
		return nil, err
	}
	resolv := func(path string) ([]byte, error) {
		if msg, ok := rec[shim.KeyResolvConfErr]; ok {
			return nil, fmt.Errorf("%s", msg)
		}
		data, ok := rec[shim.KeyResolvConf]
		if !ok {
			return nil, fmt.Errorf("the plugin did not send %s", path)
		}
		return data, nil
	}
	conf, cerr := loadConfig(verb, rec[shim.KeyStdin], env("CNI_ARGS"), resolv)
	if cerr != nil {
		return nil, cerr
	}
	c := &Call{Config: conf, start: time.Now(), netns: env(shim.KeyNetNS)}
	c.pid, _ = strconv.Atoi(env(shim.KeyPID))
	conf.ContainerID, conf.IfName = env("CNI_CONTAINERID"), env("CNI_IFNAME")
	if verb == "ADD" {
		if err := c.netnsError(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkEnv checks the CNI environment of verb: every variable it needs, the container ID and the
// interface name with the CNI library's validators.
func checkEnv(verb string, env func(string) string) *types.Error {
	var missing []string
	for _, v := range requiredEnv {
		if env(v.name) == "" && (v.name == "CNI_COMMAND" || strings.Contains(v.verbs, verb)) {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "required environment variables missing: " + strings.Join(missing, ", ")}
	}
	if _, known := minVersion[verb]; !known {
		return &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("CNI_COMMAND %q is not a command block-ipam serves (ADD, CHECK, DEL, GC, STATUS, VERSION)", verb)}
	}
	if verb == "ADD" || verb == "CHECK" || verb == "DEL" {
		if err := utils.ValidateContainerID(env("CNI_CONTAINERID")); err != nil {
			return &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID: " + err.Msg, Details: err.Details}
		}
		if err := utils.ValidateInterfaceName(env("CNI_IFNAME")); err != nil {
			return &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_IFNAME: " + err.Msg, Details: err.Details}
		}
	}
	return nil
}

// checkVersion checks the configuration's cniVersion for verb: at least the verb's minimum, and one
// of block-ipam's versions (1); a cniVersion that is no version is 6.
func checkVersion(verb, cniVersion string) *types.Error {
	v := cniVersion
	if v == "" {
		v = "0.1.0" // the CNI library's reading of an absent cniVersion
	}
	if minimum := minVersion[verb]; minimum != "" {
		ok, err := version.GreaterThanOrEqualTo(v, minimum)
		if err != nil {
			return &types.Error{Code: types.ErrDecodingFailure, Msg: "cniVersion: " + err.Error()}
		}
		if !ok {
			return &types.Error{Code: types.ErrIncompatibleCNIVersion, Msg: fmt.Sprintf("cniVersion %q does not allow %s (it needs %s or later)", cniVersion, verb, minimum)}
		}
	}
	for _, s := range shim.Versions {
		if s == v {
			return nil
		}
	}
	if _, _, _, err := version.ParseVersion(v); err != nil {
		return &types.Error{Code: types.ErrDecodingFailure, Msg: "cniVersion: " + err.Error()}
	}
	return &types.Error{Code: types.ErrIncompatibleCNIVersion, Msg: fmt.Sprintf("cniVersion %q is not one block-ipam supports (%s)", cniVersion, strings.Join(shim.Versions, ", "))}
}

// netnsError is the plugin's verdict on CNI_NETNS as a CNI error: 8 for the plugin's own network
// namespace, or for one it could not compare with its own.
func (c *Call) netnsError() *types.Error {
	switch c.netns {
	case "", shim.NetNSOther:
		return nil
	case shim.NetNSOwn:
		return &types.Error{Code: types.ErrInvalidNetNS, Msg: "CNI_NETNS is the plugin's own network namespace"}
	}
	return &types.Error{Code: types.ErrInvalidNetNS, Msg: "CNI_NETNS: " + c.netns}
}

// Render returns the reply frame for the daemon's reply r: the result in the configuration's CNI
// version (ADD) or the error, the call's log line, and the daemon's figures. A DEL is served
// whatever CNI_NETNS is (the release never needs it) and then fails as skel failed it: 8 for the
// plugin's own network namespace.
func (c *Call) Render(r *Reply) []byte {
	conf, req := c.Config, c.Request()
	var line bytes.Buffer
	log := newLogger(&line, conf.LogLevel, c.pid)
	attrs := []any{"container", req.ContainerID, "ifname", req.IfName, "network", conf.Network,
		"node", r.Node, "attempts", r.Attempts, "batched", r.Batched, "etcd_round_trips", r.RoundTrips,
		"duration_ms", float64(time.Since(c.start).Microseconds()) / 1000}
	stdout, err := c.render(r)
	switch {
	case err != nil:
		log.Error(req.Verb+" failed", append(attrs, "err", err)...)
	case req.Verb == "ADD":
		log.Info(req.Verb, append(attrs, "ips", resultIPs(conf.Result(r.Allocations)))...)
	case req.Verb == "GC":
		log.Info(req.Verb, append(attrs, "released", r.Released)...)
	default:
		log.Info(req.Verb, attrs...)
	}
	return replyFrame(stdout, err, line.Bytes(), r)
}

// render returns what the plugin prints for r, or the call's error.
func (c *Call) render(r *Reply) ([]byte, *types.Error) {
	if r.Code != 0 {
		return nil, &types.Error{Code: r.Code, Msg: r.Msg}
	}
	switch c.Request().Verb {
	case "ADD":
		res, err := c.Config.Result(r.Allocations).GetAsVersion(c.Config.CNIVersion)
		if err != nil {
			return nil, &types.Error{Code: types.ErrInternal, Msg: "rendering the result: " + err.Error()}
		}
		var buf bytes.Buffer
		if err := res.PrintTo(&buf); err != nil {
			return nil, &types.Error{Code: types.ErrInternal, Msg: "rendering the result: " + err.Error()}
		}
		return buf.Bytes(), nil
	case "DEL":
		return nil, c.netnsError()
	}
	return nil, nil
}

// RenderError returns the reply frame of a call refused before it was served.
func RenderError(err *types.Error) []byte { return replyFrame(nil, err, nil, nil) }

// replyFrame encodes the reply frame: the result, or the error as the CNI library prints it, the
// log line, and the daemon's figures when it served the request.
func replyFrame(stdout []byte, err *types.Error, line []byte, r *Reply) []byte {
	exit := "0"
	if err != nil {
		exit = "1"
		stdout, _ = json.MarshalIndent(err, "", "    ")
	}
	out := shim.AppendRecord(nil, shim.KeyExit, []byte(exit))
	out = shim.AppendRecord(out, shim.KeyStdout, stdout)
	if len(line) > 0 {
		out = shim.AppendRecord(out, shim.KeyLog, line)
	}
	if r != nil {
		out = shim.AppendRecord(out, shim.KeyNode, []byte(r.Node))
		out = shim.AppendRecord(out, shim.KeyAttempts, strconv.AppendInt(nil, int64(r.Attempts), 10))
		out = shim.AppendRecord(out, shim.KeyBatched, strconv.AppendInt(nil, int64(r.Batched), 10))
		out = shim.AppendRecord(out, shim.KeyRoundTrips, strconv.AppendInt(nil, r.RoundTrips, 10))
		out = shim.AppendRecord(out, shim.KeyReleased, strconv.AppendInt(nil, int64(r.Released), 10))
	}
	return shim.Seal(out)
}

// newLogger is the logger of one call: slog's text, with the plugin's pid, at the configured level.
// The daemon renders the line and the plugin appends it to log_file or stderr, never stdout:
// stdout carries the protocol.
func newLogger(w *bytes.Buffer, level string, pid int) *slog.Logger {
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
