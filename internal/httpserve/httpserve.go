// Package httpserve runs the daemons' metrics and health servers for as long as they run.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Until serves l until ctx is done, then shuts srv down, giving requests in flight grace to finish;
// what is still open then (a client that does not hang up, or the fresh connection a client opened
// and never used, which Go's server waits up to 5 s for) is closed. Only a failure to serve is an
// error: the end of a daemon's metrics server is no reason for its stop to fail.
func Until(ctx context.Context, srv *http.Server, l net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
