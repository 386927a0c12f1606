package cni

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// This file is the smallest HTTP/1.1 client the etcd gateway needs: POST with a JSON body on one
// kept-alive connection, responses with Content-Length or chunked bodies. net/http would do, but its
// transport machinery and package set add ~0.5 ms to every exec of the plugin (measured), and the
// plugin makes one or two requests per process.

// maxResponse bounds a response body (every block of a large cluster fits).
const maxResponse = 256 << 20

// httpConn is an HTTP/1.1 connection to one etcd endpoint.
type httpConn struct {
	endpoint int
	host     string
	c        net.Conn
	r        *bufio.Reader
}

// dialHTTP connects to ep (with TLS for https) within ctx's deadline.
func dialHTTP(ctx context.Context, idx int, ep endpoint, cfg *tls.Config) (*httpConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ep.host)
	if err != nil {
		return nil, err
	}
	if ep.tls {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg != nil {
			tc = cfg.Clone()
		}
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(ep.host)
		}
		conn := tls.Client(c, tc)
		if err := conn.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		c = conn
	}
	return &httpConn{endpoint: idx, host: ep.host, c: c, r: bufio.NewReaderSize(c, 16<<10)}, nil
}

func (h *httpConn) close() { h.c.Close() }

// post sends a POST request and returns the response status and body. Any error leaves the
// connection unusable.
func (h *httpConn) post(ctx context.Context, path string, body []byte) (int, []byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		h.c.SetDeadline(dl)
	} else {
		h.c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { h.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req := make([]byte, 0, len(body)+160)
	req = append(req, "POST "...)
	req = append(req, path...)
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, h.host...)
	req = append(req, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	req = strconv.AppendInt(req, int64(len(body)), 10)
	req = append(req, "\r\n\r\n"...)
	req = append(req, body...)
	if _, err := h.c.Write(req); err != nil {
		return 0, nil, err
	}

	line, err := h.line()
	if err != nil {
		return 0, nil, err
	}
	proto, rest, _ := strings.Cut(line, " ")
	codeStr, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(codeStr)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	length, chunked := -1, false
	for {
		line, err := h.line()
		if err != nil {
			return 0, nil, err
		}
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return 0, nil, fmt.Errorf("malformed header %q", line)
		}
		value = strings.TrimSpace(value)
		switch strings.ToLower(name) {
		case "content-length":
			if length, err = strconv.Atoi(value); err != nil || length < 0 || length > maxResponse {
				return 0, nil, fmt.Errorf("bad Content-Length %q", value)
			}
		case "transfer-encoding":
			chunked = strings.EqualFold(value, "chunked")
		}
	}
	var data []byte
	switch {
	case chunked:
		data, err = h.chunked()
	case length >= 0:
		data = make([]byte, length)
		_, err = io.ReadFull(h.r, data)
	default:
		return 0, nil, errors.New("response without length (Connection: close bodies are not supported)")
	}
	if err != nil {
		return 0, nil, err
	}
	return status, data, nil
}

// line reads one CRLF-terminated line without its terminator.
func (h *httpConn) line() (string, error) {
	s, err := h.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(s, "\r\n"), nil
}

// chunked reads a chunked body and its (ignored) trailers.
func (h *httpConn) chunked() ([]byte, error) {
	var data []byte
	for {
		line, err := h.line()
		if err != nil {
			return nil, err
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 || int64(len(data))+n > maxResponse {
			return nil, fmt.Errorf("bad chunk size %q", line)
		}
		if n == 0 {
			for {
				if t, err := h.line(); err != nil || t == "" {
					return data, err
				}
			}
		}
		start := len(data)
		data = append(data, make([]byte, n)...)
		if _, err := io.ReadFull(h.r, data[start:]); err != nil {
			return nil, err
		}
		if crlf, err := h.line(); err != nil || crlf != "" {
			return nil, fmt.Errorf("chunk not followed by CRLF: %v", err)
		}
	}
}

// appendTxnJSON encodes a TxnRequest in the gateway's JSON (protojson names; bytes in base64; int64
// as strings), without reflection.
func appendTxnJSON(b []byte, cmps []compare, success, failure []op) []byte {
	b = append(b, `{"compare":[`...)
	for i, c := range cmps {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"result":"`...)
		b = append(b, c.result...)
		b = append(b, `","target":"`...)
		b = append(b, c.target...)
		b = append(b, `","key":`...)
		b = appendB64(b, c.key)
		if c.rangeEnd != "" {
			b = append(b, `,"range_end":`...)
			b = appendB64(b, c.rangeEnd)
		}
		switch c.target {
		case targetValue:
			b = append(b, `,"value":"`...)
			b = base64.StdEncoding.AppendEncode(b, c.bytes)
			b = append(b, `"}`...)
			continue
		case targetVersion:
			b = append(b, `,"version":"`...)
		case targetCreate:
			b = append(b, `,"create_revision":"`...)
		default:
			b = append(b, `,"mod_revision":"`...)
		}
		b = strconv.AppendInt(b, c.value, 10)
		b = append(b, `"}`...)
	}
	b = append(b, `],"success":`...)
	b = appendOps(b, success)
	b = append(b, `,"failure":`...)
	b = appendOps(b, failure)
	return append(b, '}')
}

func appendOps(b []byte, ops []op) []byte {
	b = append(b, '[')
	for i, o := range ops {
		if i > 0 {
			b = append(b, ',')
		}
		switch o.kind {
		case opRange:
			b = append(b, `{"request_range":{"key":`...)
			b = appendB64(b, o.key)
			if o.rangeEnd != "" {
				b = append(b, `,"range_end":`...)
				b = appendB64(b, o.rangeEnd)
			}
			if o.keysOnly {
				b = append(b, `,"keys_only":true`...)
			}
		case opPut:
			b = append(b, `{"request_put":{"key":`...)
			b = appendB64(b, o.key)
			b = append(b, `,"value":"`...)
			b = base64.StdEncoding.AppendEncode(b, o.value)
			b = append(b, '"')
		case opDelete:
			b = append(b, `{"request_delete_range":{"key":`...)
			b = appendB64(b, o.key)
		}
		b = append(b, "}}"...)
	}
	return append(b, ']')
}

func appendB64(b []byte, s string) []byte {
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, []byte(s))
	return append(b, '"')
}
