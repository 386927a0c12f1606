package etcdconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
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
