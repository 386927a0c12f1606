// Package logging builds the slog logger of the project's daemons from their --log-level and
// --log-format flags, so that both daemons accept and refuse the same values.
package logging

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"sync"
)

// New returns a logger writing to w at level (debug, info, warn or error) in format (text or json).
// Its errors name the flag at fault.
func New(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", format)
}

// Buffer is a log sink safe for concurrent writes whose text can be read while loggers write: for
// tests that check what a daemon logged.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
