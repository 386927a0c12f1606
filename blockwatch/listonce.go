package blockwatch

import (
	"context"
	"fmt"
)

// List takes one complete snapshot (a list of every prefix at one revision) and returns it; it is what
// the routes subcommand and the lab use. It keeps trying until ctx is done, then fails with the last
// etcd error.
func List(ctx context.Context, cfg Config) (*Snapshot, error) {
	w, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case snap := <-w.Updates():
		return snap, nil
	case <-ctx.Done():
		last := w.Status().LastError
		if last == "" {
			return nil, fmt.Errorf("list etcd: %w", ctx.Err())
		}
		return nil, fmt.Errorf("list etcd: %w: %s", ctx.Err(), last)
	}
}
