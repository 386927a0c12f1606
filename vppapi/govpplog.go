package vppapi

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/core"
)

// ForwardGoVPPLogs sends what GoVPP logs (through its own global logrus loggers, in core and in the
// socket adapter) to l, with component=govpp, so that a daemon writes every line in one format: with
// --log-format json nothing but JSON lines. GoVPP's loggers are process-wide and read without a lock
// by its goroutines, so they are set once; a later call (a test running the daemon again in one
// process) only changes where the entries go.
func ForwardGoVPPLogs(l *slog.Logger) {
	l = l.With("component", "govpp")
	govppLogs.to.Store(l)
	govppLogs.once.Do(func() {
		govppLogs.lr = newLogrusBridge(&govppLogs.to)
		core.SetLogger(govppLogs.lr)
		socketclient.SetLogger(govppLogs.lr)
	})
	govppLogs.lr.SetLevel(bridgeLevel(l)) // atomic in logrus
}

// govppLogs is the one bridge GoVPP's loggers are set to.
var govppLogs struct {
	once sync.Once
	lr   *logrus.Logger
	to   atomic.Pointer[slog.Logger]
}

// newLogrusBridge returns a logrus logger that writes nothing itself and hands every entry to the
// logger in to, at the level bridgeLevel gives for it.
func newLogrusBridge(to *atomic.Pointer[slog.Logger]) *logrus.Logger {
	lr := logrus.New()
	lr.SetOutput(io.Discard)
	lr.SetLevel(bridgeLevel(to.Load()))
	lr.AddHook(slogHook{to})
	return lr
}

// bridgeLevel is the logrus level entries for l pass at. GoVPP logs every message sent and received at
// debug level, which would slow a resync of 20,000 routes down twentyfold: its debug entries pass only
// when GoVPP's own switch, DEBUG_GOVPP, is set (and l shows debug).
func bridgeLevel(l *slog.Logger) logrus.Level {
	if os.Getenv(core.DebugEnvVar) != "" && l.Enabled(context.Background(), slog.LevelDebug) {
		return logrus.DebugLevel
	}
	return logrus.InfoLevel
}

// slogHook forwards logrus entries to slog, mapping the levels and keeping the fields.
type slogHook struct{ to *atomic.Pointer[slog.Logger] }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	level := slog.LevelError
	switch e.Level {
	case logrus.TraceLevel, logrus.DebugLevel:
		level = slog.LevelDebug
	case logrus.InfoLevel:
		level = slog.LevelInfo
	case logrus.WarnLevel:
		level = slog.LevelWarn
	}
	attrs := make([]slog.Attr, 0, len(e.Data))
	for k, v := range e.Data {
		attrs = append(attrs, slog.Any(k, v))
	}
	h.to.Load().LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}
