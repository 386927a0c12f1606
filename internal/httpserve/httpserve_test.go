package httpserve

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestUntilClosesWhatStaysOpen: a connection that never sends a request holds Go's Shutdown for
// up to 5 s; Until closes it after the grace and returns nil.
func TestUntilClosesWhatStaysOpen(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Until(ctx, srv, l, 100*time.Millisecond) }()
	idle, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(50 * time.Millisecond) // the server has accepted it
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Until = %v, want nil", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("Until returned after %s, want about the grace", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Until did not return")
	}
}
