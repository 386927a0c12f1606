package vppapi

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/core"
)

// ForwardGoVPPLogs sends what GoVPP logs (through its own global logrus loggers, in core and in the
// socket adapter) to l, with component=govpp, so that a daemon writes every line in one format: with
// --log-format json nothing but JSON lines. It sets process-wide state: call it once, from main.
func ForwardGoVPPLogs(l *slog.Logger) {
	lr := newLogrusBridge(l.With("component", "govpp"))
	core.SetLogger(lr)
	socketclient.SetLogger(lr)
}

// newLogrusBridge returns a logrus logger that writes nothing itself and hands every entry to l. GoVPP
// logs every message sent and received at debug level, which would slow a resync of 20,000 routes down
// twentyfold: its debug entries pass only when GoVPP's own switch, DEBUG_GOVPP, is set (and l shows debug).
func newLogrusBridge(l *slog.Logger) *logrus.Logger {
	lr := logrus.New()
	lr.SetOutput(io.Discard)
	lr.SetLevel(logrus.InfoLevel)
	if os.Getenv(core.DebugEnvVar) != "" && l.Enabled(context.Background(), slog.LevelDebug) {
		lr.SetLevel(logrus.DebugLevel)
	}
	lr.AddHook(slogHook{l})
	return lr
}

// slogHook forwards logrus entries to slog, mapping the levels and keeping the fields.
type slogHook struct{ l *slog.Logger }

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
	h.l.LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}
