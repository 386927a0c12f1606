// Package shim is block-ipam's CNI plugin, the program the runtime executes for every call. It
// answers VERSION itself and forwards every other call (the environment and stdin as the runtime
// gave them) to the node daemon, which does every part of CNI's semantics (package cni: the
// environment, the configuration, the result in the configuration's CNI version) and returns the
// bytes to print, the exit code and the log line. The plugin reads the configuration only for what
// it needs to make the call: the daemon's socket (an ipam.socket it cannot dial is 7, before
// dialing), its timeout, the resolvConf file and the log file. A call the daemon cannot be asked,
// or whose answer is cut short, fails with 11 (try again later), 50 for STATUS.
//
// Why so little: a Go program's start is most of what an exec'd plugin costs, and the runtime pays
// it on every ADD and DEL. This package links no CNI library, no net package (its poller starts
// threads and an epoll instance), no slog and no time zone; the socket is blocking, with the
// kernel's send and receive timeouts as the deadline.
package shim

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Defaults shared with the daemon's reading of the configuration (package cni).
const (
	// DefaultSocket is where the daemon listens unless ipam.socket says otherwise.
	DefaultSocket = "/run/block-ipam/block-ipam.sock"
	// DefaultTimeout bounds one plugin call, the daemon's retries included, unless ipam.timeout
	// says otherwise.
	DefaultTimeout = 30 * time.Second
	// StatusTimeout bounds STATUS.
	StatusTimeout = 2 * time.Second
	// MaxResolvConf bounds the resolvConf file read at every ADD.
	MaxResolvConf = 64 << 10
	// MaxSocketPath is the longest path a unix socket may have: sun_path holds 108 bytes on Linux,
	// one of them the terminating NUL that Go's syscall package insists on.
	MaxSocketPath = 107
)

// CallTimeout is how long one call of verb waits for the daemon, the daemon's retries included:
// StatusTimeout for STATUS, else the configuration's ipam.timeout (value, "" for none) or
// DefaultTimeout. ok is false when value is not a positive duration: the daemon refuses it (7); the
// plugin waits DefaultTimeout for that answer. Plugin and daemon read the timeout here, once.
func CallTimeout(verb, value string) (d time.Duration, ok bool) {
	d = DefaultTimeout
	if value != "" {
		v, err := time.ParseDuration(value)
		if err != nil || v <= 0 {
			return DefaultTimeout, false
		}
		d = v
	}
	if verb == "STATUS" {
		return StatusTimeout, true
	}
	return d, true
}

// CheckSocketPath returns why path cannot be the daemon's socket, or "": an absolute path without
// NUL, of at most MaxSocketPath bytes. Plugin, configuration and daemon check it the same way
// before any connection: a path connect(2) refuses would fail every call with 11, "try again".
func CheckSocketPath(path string) string {
	switch {
	case !strings.HasPrefix(path, "/") || strings.ContainsRune(path, 0):
		return strconv.Quote(path) + " is not an absolute path"
	case len(path) > MaxSocketPath:
		return strconv.Quote(path) + " is " + strconv.Itoa(len(path)) + " bytes, longer than a unix socket path may be (" + strconv.Itoa(MaxSocketPath) + ")"
	}
	return ""
}

// Versions are the CNI versions block-ipam supports; the last is the newest.
var Versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// VersionJSON is the answer to VERSION, as skel prints it.
func VersionJSON() string {
	return `{"cniVersion":"` + Versions[len(Versions)-1] + `","supportedVersions":["` + strings.Join(Versions, `","`) + "\"]}\n"
}

// Main runs the plugin and returns its exit code. about is printed on stderr when CNI_COMMAND is
// unset, as skel does.
func Main(about string) int {
	cmd := getenv("CNI_COMMAND")
	switch cmd {
	case "":
		// Not a CNI call: someone ran the plugin by hand.
		writeAll(2, []byte(about+"\nCNI protocol versions supported: "+strings.Join(Versions, ", ")+"\n"))
		return 0
	case "VERSION":
		writeAll(1, []byte(VersionJSON()))
		return 0
	}
	stdin, rerr := readAll(0, MaxFrame)
	if rerr == errTooLarge {
		return fail(tooLarge(len(stdin)))
	}
	if rerr != nil {
		return fail(&Error{Code: ErrIOFailure, Msg: "error reading from stdin: " + rerr.Error()})
	}
	conf, err := parseConf(stdin, cmd)
	if err != nil {
		return fail(err)
	}

	frame := make([]byte, 0, len(stdin)+512)
	for _, name := range Env {
		if v := getenv(name); v != "" {
			frame = AppendRecord(frame, name, []byte(v))
		}
	}
	frame = AppendRecord(frame, KeyPID, strconv.AppendInt(nil, int64(syscall.Getpid()), 10))
	if cmd == "ADD" || cmd == "DEL" {
		if o := strings.ToUpper(getenv("CNI_NETNS_OVERRIDE")); o != "TRUE" && o != "1" {
			frame = AppendRecord(frame, KeyNetNS, []byte(netnsOf(getenv("CNI_NETNS"))))
		}
	}
	if conf.resolvConf != "" {
		if data, err := ReadResolvConf(conf.resolvConf); err != nil {
			frame = AppendRecord(frame, KeyResolvConfErr, []byte(err.Error()))
		} else {
			frame = AppendRecord(frame, KeyResolvConf, data)
		}
	}
	frame = Seal(AppendRecord(frame, KeyStdin, stdin))
	if len(frame) > MaxFrame {
		// The daemon would refuse it: say so without asking, and not as an unreachable daemon,
		// which the runtime retries for ever.
		return fail(tooLarge(len(frame)))
	}

	data, cerr := exchange(conf.socket, frame, conf.timeout)
	var reply map[string][]byte
	if cerr == nil {
		var perr error
		if reply, perr = ParseFrame(data); perr == nil && (reply[KeyExit] == nil || reply[KeyStdout] == nil) {
			perr = errors.New("no exit code or output")
		}
		if perr != nil {
			// A daemon that dies mid-reply leaves it cut short: the outcome is unknown. A daemon of
			// another release answers without this release's Magic.
			cerr = &callError{msg: "block-ipam daemon at " + conf.socket + ": incomplete reply (" + perr.Error() + "): it may have stopped while answering, or be of another release than this plugin", unreachable: true}
		}
	}
	if cerr != nil {
		code := ErrInternal
		if cerr.unreachable {
			code = ErrTryAgainLater
			if cmd == "STATUS" {
				code = ErrPluginNotAvailable
			}
		}
		e := &Error{Code: code, Msg: cerr.msg}
		conf.logFailure(cmd, e)
		return fail(e)
	}
	if line := reply[KeyLog]; len(line) > 0 {
		// The file is the one this plugin read from the configuration: it opens no path the daemon names.
		appendLog(conf.logFile, line)
	}
	writeAll(1, reply[KeyStdout])
	if string(reply[KeyExit]) == "0" {
		return 0
	}
	return 1
}

// getenv is syscall.Getenv without its second result.
func getenv(name string) string {
	v, _ := syscall.Getenv(name)
	return v
}

// fail prints a CNI error as skel does and returns the exit code.
func fail(e *Error) int {
	writeAll(1, e.JSON())
	return 1
}

// conf is what the plugin reads of the network configuration.
type conf struct {
	network    string
	socket     string
	timeout    time.Duration
	resolvConf string
	logFile    string
}

// parseConf finds the daemon's socket and what the plugin must read or wait for on the daemon's
// behalf. It decodes raw values only, and checks only what it cannot forward: a socket that cannot
// be one (7). Whatever else is wrong, JSON that is not JSON included, is the daemon's to report:
// without an ipam.socket the plugin asks the daemon at DefaultSocket.
func parseConf(stdin []byte, cmd string) (*conf, *Error) {
	var top struct {
		Name json.RawMessage `json:"name"`
		IPAM struct {
			Socket     json.RawMessage `json:"socket"`
			ResolvConf json.RawMessage `json:"resolvConf"`
			DNS        json.RawMessage `json:"dns"`
			Timeout    json.RawMessage `json:"timeout"`
			LogFile    json.RawMessage `json:"log_file"`
		} `json:"ipam"`
	}
	_ = json.Unmarshal(stdin, &top)
	im := top.IPAM
	c := &conf{network: str(top.Name), socket: DefaultSocket, logFile: str(im.LogFile)}
	if len(im.Socket) > 0 && string(im.Socket) != "null" {
		s, ok := unquote(im.Socket)
		s = strings.TrimSpace(s)
		switch {
		case !ok:
			return nil, &Error{Code: ErrInvalidNetworkConfig, Msg: "ipam.socket: " + string(im.Socket) + " is not a string"}
		case s == "":
		case CheckSocketPath(s) != "":
			return nil, &Error{Code: ErrInvalidNetworkConfig, Msg: "ipam.socket: " + CheckSocketPath(s)}
		default:
			c.socket = s
		}
	}
	c.timeout, _ = CallTimeout(cmd, str(im.Timeout))
	if cmd == "ADD" && (len(im.DNS) == 0 || string(im.DNS) == "null") {
		// Only ADD prints DNS; DEL must release whatever became of the file.
		c.resolvConf = str(im.ResolvConf)
	}
	return c, nil
}

// unquote returns the string a raw JSON value holds; ok is false when it holds no string.
func unquote(raw json.RawMessage) (s string, ok bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	return s, json.Unmarshal(raw, &s) == nil
}

func str(raw json.RawMessage) string {
	s, _ := unquote(raw)
	return s
}

// netnsOf tells whether path is the plugin's own network namespace, as skel's ns.CheckNetNS does
// after ADD and DEL: a path that cannot be read is not. The daemon reports "own" as error 8.
func netnsOf(path string) string {
	var target, self syscall.Stat_t
	if path == "" || syscall.Stat(path, &target) != nil {
		return NetNSOther
	}
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return "get plugin's netns failed: " + err.Error()
	}
	if self.Dev == target.Dev && self.Ino == target.Ino {
		return NetNSOwn
	}
	return NetNSOther
}

// ReadResolvConf reads the resolvConf file: a regular file of at most MaxResolvConf bytes, opened
// without blocking (a FIFO would hang the ADD) and checked before it is read.
func ReadResolvConf(path string) ([]byte, error) {
	fd, err := open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, errors.New("stat " + path + ": " + err.Error())
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, errors.New(path + " is not a regular file (" + fileType(st.Mode) + ")")
	}
	if st.Size > MaxResolvConf {
		return nil, errors.New(path + " is " + strconv.FormatInt(st.Size, 10) + " bytes, more than a resolv.conf (" + strconv.Itoa(MaxResolvConf) + ")")
	}
	data, err := readAll(fd, MaxResolvConf)
	if err == errTooLarge {
		return nil, errors.New(path + " is more than a resolv.conf (" + strconv.Itoa(MaxResolvConf) + " bytes)")
	}
	if err != nil {
		return nil, errors.New("read " + path + ": " + err.Error())
	}
	return data, nil
}

// fileType names a file type as Go's fs.FileMode.Type().String() does.
func fileType(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return "d---------"
	case syscall.S_IFIFO:
		return "p---------"
	case syscall.S_IFCHR:
		return "Dc---------"
	case syscall.S_IFBLK:
		return "D---------"
	case syscall.S_IFSOCK:
		return "S---------"
	case syscall.S_IFLNK:
		return "L---------"
	}
	return "?---------"
}

// open is syscall.Open with os.OpenFile's error text.
func open(path string, flags int, perm uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, flags, perm)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return -1, errors.New("open " + path + ": " + err.Error())
		}
		return fd, nil
	}
}

// errTooLarge is readAll's error for more than its limit.
var errTooLarge = errors.New("too large")

// tooLarge is the error of a call whose request (stdin, the environment and the resolvConf file)
// would be more than MaxFrame bytes: n, or more when stdin was not read to its end.
func tooLarge(n int) *Error {
	return &Error{Code: ErrInvalidNetworkConfig, Msg: "the network configuration is too large: with the call's environment and the resolvConf file it makes a request of " +
		strconv.Itoa(n) + " bytes or more, over block-ipam's limit of " + strconv.Itoa(MaxFrame) + " bytes"}
}

// readAll reads fd to its end, at most limit bytes (errTooLarge beyond).
func readAll(fd, limit int) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return buf, err
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return buf, errTooLarge
		}
	}
}

// writeAll writes b to fd.
func writeAll(fd int, b []byte) {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		b = b[n:]
	}
}

// callError is a failed exchange with the daemon; unreachable marks one whose outcome is unknown
// (the daemon could not be asked or did not answer): the runtime's retry is idempotent.
type callError struct {
	msg         string
	unreachable bool
}

// exchange sends frame to the daemon at socket and returns its reply, within timeout: one
// connection, the request, the reply until the daemon closes. The plugin's side stays open until it
// exits: its end is how the daemon learns that the plugin gave up (Magic). The
// kernel's send and receive timeouts bound one system call each, and a retry after EINTR would
// restart them: before each call they are set to the time left of the whole exchange.
func exchange(socket string, frame []byte, timeout time.Duration) ([]byte, *callError) {
	unreachable := func(what string, err error) *callError {
		if err == syscall.EAGAIN {
			return &callError{msg: "block-ipam daemon unreachable at " + socket + ": " + what + ": no answer within " + timeout.String(), unreachable: true}
		}
		return &callError{msg: "block-ipam daemon unreachable at " + socket + ": " + what + ": " + err.Error(), unreachable: true}
	}
	deadline := time.Now().Add(timeout)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, unreachable("socket", err)
	}
	defer syscall.Close(fd)
	// within sets the socket's timeout opt to the time left, or fails with EAGAIN (a timeout) when
	// none is.
	within := func(opt int) error {
		left := time.Until(deadline)
		if left <= 0 {
			return syscall.EAGAIN
		}
		tv := syscall.NsecToTimeval(left.Nanoseconds())
		if tv.Sec == 0 && tv.Usec == 0 {
			tv.Usec = 1 // zero would mean no timeout
		}
		return syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, opt, &tv)
	}
	for {
		if err = within(syscall.SO_SNDTIMEO); err == nil {
			err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: socket})
		}
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, unreachable("dial unix "+socket+": connect", err)
	}
	for b := frame; len(b) > 0; {
		n, err := 0, within(syscall.SO_SNDTIMEO)
		if err == nil {
			n, err = syscall.SendmsgN(fd, b, nil, nil, syscall.MSG_NOSIGNAL)
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, unreachable("sending the request", err)
		}
		b = b[n:]
	}
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := 0, within(syscall.SO_RCVTIMEO)
		if err == nil {
			n, err = syscall.Read(fd, buf[len(buf):cap(buf)])
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, unreachable("waiting for the reply", err)
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
		if len(buf) > MaxFrame {
			return nil, &callError{msg: "block-ipam daemon at " + socket + ": reply larger than " + strconv.Itoa(MaxFrame) + " bytes"}
		}
	}
	if len(buf) == 0 {
		return nil, &callError{msg: "block-ipam daemon unreachable at " + socket + ": the daemon closed the connection without a reply", unreachable: true}
	}
	return buf, nil
}

// appendLog appends the daemon's log line for this call to the log file, or to stderr without one
// or when it cannot be opened.
func appendLog(path string, line []byte) {
	if path != "" {
		fd, err := open(path, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CLOEXEC, 0o600)
		if err == nil {
			writeAll(fd, line)
			syscall.Close(fd)
			return
		}
		writeAll(2, []byte("block-ipam: log_file "+path+": "+err.Error()+"; logging to stderr\n"))
	}
	writeAll(2, line)
}

// logFailure logs a call the daemon did not answer, in the daemon's log format (slog's text).
func (c *conf) logFailure(cmd string, e *Error) {
	var b []byte
	b = append(b, "time="...)
	b = time.Now().AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
	for _, kv := range [][2]string{{"level", "ERROR"}, {"msg", cmd + " failed"}, {"pid", strconv.Itoa(syscall.Getpid())},
		{"container", getenv("CNI_CONTAINERID")}, {"ifname", getenv("CNI_IFNAME")}, {"network", c.network}, {"err", e.Msg}} {
		b = append(b, ' ')
		b = append(b, kv[0]...)
		b = append(b, '=')
		b = appendLogValue(b, kv[1])
	}
	appendLog(c.logFile, append(b, '\n'))
}

// appendLogValue appends a value as slog's text handler does: quoted when it is empty or holds a
// space, '=', '"', a control or a non-ASCII character.
func appendLogValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c == '=' || c == '"' || c >= 0x7f {
			return strconv.AppendQuote(b, v)
		}
	}
	if v == "" {
		return append(b, `""`...)
	}
	return append(b, v...)
}
