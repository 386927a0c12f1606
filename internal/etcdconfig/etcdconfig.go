// Package etcdconfig is the one definition of how this project's daemons reach etcd: Calico's setting
// names (--etcd-endpoints, --etcd-ca-cert-file, --etcd-cert-file, --etcd-key-file, --etcd-username with
// the password from ETCD_PASSWORD or a file), their validation before any connection opens, the
// client's timeouts and keepalives, a start-up probe that reports certificate errors as such, and a
// guard that keeps the client off members that stopped answering.
//
// Credentials are never part of an error or log text: endpoints are shown with Redacted, and the
// password lives only in Config.Password.
package etcdconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Flag names (Calico's, prefixed "--" in messages) and the environment variables Calico reads for them.
const (
	FlagEndpoints      = "etcd-endpoints"
	FlagCACertFile     = "etcd-ca-cert-file"
	FlagCAFileAlias    = "etcd-ca-file" // deprecated alias of FlagCACertFile
	FlagCertFile       = "etcd-cert-file"
	FlagKeyFile        = "etcd-key-file"
	FlagUsername       = "etcd-username"
	FlagPasswordFile   = "etcd-password-file"
	FlagDialTimeout    = "etcd-dial-timeout"
	FlagRequestTimeout = "etcd-request-timeout"

	// EnvPassword holds the password; there is deliberately no --etcd-password flag (a command line is
	// visible to every user of the host).
	EnvPassword = "ETCD_PASSWORD"
)

// CalicoEnv maps the flags that Calico has a name for to that environment variable.
var CalicoEnv = map[string]string{
	FlagEndpoints:  "ETCD_ENDPOINTS",
	FlagCACertFile: "ETCD_CA_CERT_FILE",
	FlagCertFile:   "ETCD_CERT_FILE",
	FlagKeyFile:    "ETCD_KEY_FILE",
	FlagUsername:   "ETCD_USERNAME",
}

// Defaults.
const (
	DefaultEndpoint       = "http://127.0.0.1:2379"
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	// KeepAliveTime is the gRPC keepalive ping interval: grpc-go refuses anything below 10s, and etcd
	// servers answer faster pings with GOAWAY (--grpc-keepalive-min-time, default 5s). A member that
	// froze with its sockets open is found faster by Guard and by the watch's progress probe.
	KeepAliveTime = 10 * time.Second
	// KeepAliveTimeout is how long a keepalive ping may go unanswered before the connection is closed.
	KeepAliveTimeout = 3 * time.Second
)

// Config is how to reach etcd.
type Config struct {
	Endpoints                     []string
	CACertFile, CertFile, KeyFile string
	Username                      string
	// Password is read from ETCD_PASSWORD or PasswordFile by the caller (see ReadPassword).
	Password     string
	PasswordFile string
	// DialTimeout bounds establishing a connection; RequestTimeout bounds each request.
	DialTimeout, RequestTimeout time.Duration

	// systemRoots returns the system CA pool (tests replace it).
	systemRoots func() (*x509.CertPool, error)
}

// BindFlags registers the etcd flags on fs with their defaults. The deprecated --etcd-ca-file sets the
// same value as --etcd-ca-cert-file.
func (c *Config) BindFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&c.Endpoints, FlagEndpoints, []string{DefaultEndpoint}, "etcd client URLs, comma-separated (http:// or https://, no credentials)")
	fs.StringVar(&c.CACertFile, FlagCACertFile, "", "CA certificate file that verifies etcd's server certificate (required with https:// unless the system CAs do)")
	fs.StringVar(&c.CACertFile, FlagCAFileAlias, "", "deprecated alias of --"+FlagCACertFile)
	_ = fs.MarkDeprecated(FlagCAFileAlias, "use --"+FlagCACertFile)
	fs.StringVar(&c.CertFile, FlagCertFile, "", "client certificate file for etcd (mutual TLS)")
	fs.StringVar(&c.KeyFile, FlagKeyFile, "", "client key file for etcd (mutual TLS)")
	fs.StringVar(&c.Username, FlagUsername, "", "etcd user name; its password comes from $"+EnvPassword+" or --"+FlagPasswordFile)
	fs.StringVar(&c.PasswordFile, FlagPasswordFile, "", "file holding the etcd password (instead of $"+EnvPassword+")")
	fs.DurationVar(&c.DialTimeout, FlagDialTimeout, DefaultDialTimeout, "how long to wait for a connection to etcd")
	fs.DurationVar(&c.RequestTimeout, FlagRequestTimeout, DefaultRequestTimeout, "deadline of each etcd request")
}

// ReadPassword fills Password from the file PasswordFile or, without one, from lookup(EnvPassword).
// Trailing newlines of the file are dropped.
func (c *Config) ReadPassword(lookup func(string) (string, bool)) error {
	env, inEnv := lookup(EnvPassword)
	if c.PasswordFile != "" {
		if inEnv && env != "" {
			return fmt.Errorf("--%s and $%s are exclusive", FlagPasswordFile, EnvPassword)
		}
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return fmt.Errorf("--%s: %w", FlagPasswordFile, err)
		}
		c.Password = strings.TrimRight(string(b), "\r\n")
		return nil
	}
	c.Password = env
	return nil
}

// Redacted returns the endpoints with any user information replaced, for logs and errors.
func Redacted(endpoints []string) string {
	out := make([]string, len(endpoints))
	for i, ep := range endpoints {
		if u, err := url.Parse(ep); err == nil {
			out[i] = u.Redacted()
		} else {
			out[i] = "<unparsable endpoint>"
		}
	}
	return strings.Join(out, ",")
}

// Validate checks the configuration without opening any connection; each error names the flag.
func (c *Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("--%s: at least one endpoint is required", FlagEndpoints)
	}
	https := 0
	for i, ep := range c.Endpoints {
		u, err := url.Parse(ep)
		if err != nil {
			// url's error quotes the whole input, which may hold a password.
			return fmt.Errorf("--%s: endpoint %d is not a URL", FlagEndpoints, i+1)
		}
		if u.User != nil {
			return fmt.Errorf("--%s: %s carries credentials in the URL: give --%s and $%s instead", FlagEndpoints, u.Redacted(), FlagUsername, EnvPassword)
		}
		switch {
		case u.Scheme == "https":
			https++
		case u.Scheme != "http":
			return fmt.Errorf("--%s: %q must start with http:// or https://", FlagEndpoints, ep)
		}
		if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return fmt.Errorf("--%s: %q is not scheme://host:port", FlagEndpoints, ep)
		}
	}
	if https != 0 && https != len(c.Endpoints) {
		return fmt.Errorf("--%s: mixes http:// and https:// endpoints", FlagEndpoints)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("--%s and --%s go together", FlagCertFile, FlagKeyFile)
	}
	if https == 0 {
		// TLS files with a plaintext endpoint: the operator meant TLS and would silently get none.
		for _, f := range []struct{ flag, file string }{{FlagCACertFile, c.CACertFile}, {FlagCertFile, c.CertFile}, {FlagKeyFile, c.KeyFile}} {
			if f.file != "" {
				return fmt.Errorf("--%s is set but --%s are http:// (plaintext): use https:// endpoints, or drop the TLS files", f.flag, FlagEndpoints)
			}
		}
	}
	if c.CACertFile != "" {
		b, err := os.ReadFile(c.CACertFile)
		if err != nil {
			return fmt.Errorf("--%s: %w", FlagCACertFile, err)
		}
		if !containsCertificate(b) {
			return fmt.Errorf("--%s: %s holds no PEM certificate", FlagCACertFile, c.CACertFile)
		}
	} else if https > 0 {
		roots := c.systemRoots
		if roots == nil {
			roots = x509.SystemCertPool
		}
		if pool, err := roots(); err != nil || pool == nil || pool.Equal(x509.NewCertPool()) {
			return fmt.Errorf("--%s: required with https:// endpoints: there are no system CA certificates to verify etcd's server with", FlagCACertFile)
		}
	}
	if c.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
			return fmt.Errorf("--%s, --%s: %w", FlagCertFile, FlagKeyFile, err)
		}
	}
	if c.Username == "" && c.Password != "" {
		return fmt.Errorf("an etcd password is set ($%s or --%s) but --%s is not", EnvPassword, FlagPasswordFile, FlagUsername)
	}
	if c.Username != "" && c.Password == "" {
		return fmt.Errorf("--%s %q: no password: set $%s or --%s", FlagUsername, c.Username, EnvPassword, FlagPasswordFile)
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("--%s must be positive", FlagDialTimeout)
	}
	if c.RequestTimeout <= 0 {
		return fmt.Errorf("--%s must be positive", FlagRequestTimeout)
	}
	return nil
}

func containsCertificate(b []byte) bool {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return false
		}
		if blk.Type == "CERTIFICATE" {
			return true
		}
	}
}

// TLS returns the client TLS configuration; nil for http:// endpoints.
func (c *Config) TLS() (*tls.Config, error) {
	if len(c.Endpoints) == 0 || !strings.HasPrefix(c.Endpoints[0], "https://") {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: c.CACertFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS configuration: %w", err)
	}
	return cfg, nil
}

// Client creates the etcd client (which dials lazily: an unreachable etcd shows in the first calls).
func (c *Config) Client() (*clientv3.Client, error) {
	tlsCfg, err := c.TLS()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(c.clientConfig(c.Endpoints, tlsCfg))
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", Redacted(c.Endpoints), err)
	}
	return cli, nil
}

func (c *Config) clientConfig(endpoints []string, tlsCfg *tls.Config) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          c.DialTimeout,
		DialKeepAliveTime:    KeepAliveTime,
		DialKeepAliveTimeout: KeepAliveTimeout,
		PermitWithoutStream:  true,
		TLS:                  tlsCfg,
		Username:             c.Username,
		Password:             c.Password,
		Logger:               zap.NewNop(),
	}
}

// PlaintextCredentials reports whether a password would be sent over http://.
func (c *Config) PlaintextCredentials() bool {
	return c.Username != "" && len(c.Endpoints) > 0 && strings.HasPrefix(c.Endpoints[0], "http://")
}

// ErrCertificate marks a probe failure caused by a certificate: a configuration error that retrying
// does not fix.
var ErrCertificate = errors.New("certificate error")
