package etcdconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Probe connects to every endpoint (TCP, then the TLS handshake for https://) and reports what fails,
// by endpoint. A certificate problem — etcd's certificate not verified by --etcd-ca-cert-file, a name
// mismatch, or etcd rejecting the client certificate — is wrapped in ErrCertificate and says which
// flag to check; gRPC would only report it as a request deadline. It returns nil when every endpoint
// completed its handshake.
func (c *Config) Probe(ctx context.Context) error {
	tlsCfg, err := c.TLS()
	if err != nil {
		return err
	}
	var errs []error
	for _, ep := range c.Endpoints {
		if err := c.probe(ctx, ep, tlsCfg); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Config) probe(ctx context.Context, ep string, tlsCfg *tls.Config) error {
	u, err := url.Parse(ep)
	if err != nil {
		return fmt.Errorf("etcd endpoint %s: not a URL", Redacted([]string{ep}))
	}
	name := u.Redacted()
	ctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("etcd %s: %w: %w", name, ErrUnreachable, err)
	}
	defer conn.Close()
	if tlsCfg == nil {
		return nil
	}
	cfg := tlsCfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	// gRPC negotiates HTTP/2; a server that requires it may refuse a handshake without.
	cfg.NextProtos = []string{"h2"}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		if speaksPlaintext(ctx, err, u.Host) {
			return fmt.Errorf("etcd %s: %w: the endpoint answers plaintext HTTP: use http://, or serve etcd's client URL with TLS (%w)",
				name, ErrNotTLS, err)
		}
		return c.tlsError(name, err)
	}
	// With TLS 1.3 the server checks the client certificate after the client's side of the handshake
	// is done: its refusal arrives as an alert on the first read. Silence means accepted.
	tc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var buf [1]byte
	if _, err := tc.Read(buf[:]); err != nil {
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) && strings.Contains(err.Error(), "tls:") {
			return c.tlsError(name, err)
		}
	}
	return nil
}

// ErrNotTLS marks a probe failure of an https:// endpoint whose server speaks plaintext: a
// configuration error that retrying does not fix.
var ErrNotTLS = errors.New("not TLS")

// speaksPlaintext reports whether a failed TLS handshake with host was with a plaintext server: it
// answered with bytes that are no TLS record, or it hung up on the ClientHello (as etcd's plaintext
// client port does) and a fresh connection answers an HTTP/1.1 request in plaintext. A server that
// just drops connections (a proxy without a backend) answers neither, and stays a transient failure.
func speaksPlaintext(ctx context.Context, handshake error, host string) bool {
	var rec tls.RecordHeaderError
	if errors.As(handshake, &rec) {
		return true
	}
	if !errors.Is(handshake, io.EOF) && !errors.Is(handshake, syscall.ECONNRESET) {
		return false
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "GET /version HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
		return false
	}
	buf := make([]byte, len("HTTP/1."))
	_, err = io.ReadFull(conn, buf)
	return err == nil && string(buf) == "HTTP/1."
}

// ErrUnreachable marks a probe failure of an endpoint that accepts no TCP connection.
var ErrUnreachable = errors.New("unreachable")

// NoneReachable reports whether err, from Probe of n endpoints, says that none of them accepts a
// connection.
func NoneReachable(err error, n int) bool {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return n == 1 && errors.Is(err, ErrUnreachable)
	}
	errs := j.Unwrap()
	if len(errs) != n {
		return false
	}
	for _, e := range errs {
		if !errors.Is(e, ErrUnreachable) {
			return false
		}
	}
	return true
}

// tlsError names the flag that a TLS failure points to.
func (c *Config) tlsError(endpoint string, err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &hostname):
		return fmt.Errorf("etcd %s: %w: server certificate does not match the endpoint's host name: %w", endpoint, ErrCertificate, err)
	case errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("etcd %s: %w: server certificate not trusted (check --%s): %w", endpoint, ErrCertificate, FlagCACertFile, err)
	case strings.Contains(err.Error(), "remote error: tls:"):
		return fmt.Errorf("etcd %s: %w: etcd refused the TLS handshake (check --%s and --%s): %w", endpoint, ErrCertificate, FlagCertFile, FlagKeyFile, err)
	}
	return fmt.Errorf("etcd %s: TLS handshake: %w", endpoint, err)
}

// Connect is how a daemon starts on etcd: it warns when a password would cross plaintext http://, probes
// the endpoints and fails at once on a certificate problem or an https:// endpoint that speaks
// plaintext (neither heals by retrying: fail now, saying so, instead of reporting request deadlines
// forever), warns about endpoints that are merely down (the client retries them like any other etcd
// outage), and returns the client.
func (c *Config) Connect(ctx context.Context, log *slog.Logger) (*clientv3.Client, error) {
	if c.PlaintextCredentials() {
		log.Warn("the etcd password is sent over plaintext http:// endpoints; use https://")
	}
	if err := c.Probe(ctx); err != nil {
		if errors.Is(err, ErrCertificate) || errors.Is(err, ErrNotTLS) {
			return nil, err
		}
		log.Warn("etcd not reachable yet; retrying", "err", err)
	}
	return c.Client()
}
