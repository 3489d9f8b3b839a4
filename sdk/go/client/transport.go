package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// request is one call of the API.
type request struct {
	method string
	path   string
	query  url.Values
	body   any // nil: none
	// within bounds the call, its rounds over the addresses included (0: the client's
	// timeout); perTry bounds one try at one address (0: within).
	within, perTry time.Duration
	// safe: the request may be sent again (a read, or a send with a message id).
	safe bool
}

// do sends r to whichever node serves and decodes its answer into out. A request that
// is safe to repeat (a GET, or r.safe) is tried again across the addresses, with
// backoff, until r.within: a node restarting or a standby taking over is a gap, not an
// error. Others try each address once: a POST whose connection broke may have been
// committed, and is not sent twice.
func (c *Client) do(ctx context.Context, r request, out any) error {
	var data []byte
	if r.body != nil {
		var err error
		if data, err = json.Marshal(r.body); err != nil {
			return fmt.Errorf("dex: the request body: %w", err)
		}
	}
	within := r.within
	if within <= 0 {
		within = c.timeout
	}
	perTry := r.perTry
	if perTry <= 0 {
		perTry = within
	}
	safe := r.safe || r.method == "GET"
	started := time.Now()
	answered, last, err := c.round(ctx, r, data, perTry, out)
	if answered {
		return err
	}
	if !safe {
		return c.unavailable(last)
	}
	for attempt := 1; ; attempt++ {
		if answered, last, err = c.round(ctx, r, data, perTry, out); answered {
			return err
		}
		wait := backoff(attempt, retryInitial, retryMax)
		if time.Since(started)+wait >= within {
			return c.unavailable(last)
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// round tries each address once, from the one that answered last. answered is false
// if none did (last is the last try's error); an error answer is err, as it is.
func (c *Client) round(ctx context.Context, r request, data []byte, perTry time.Duration, out any) (answered bool, last, err error) {
	for range c.addresses {
		at := c.current.Load()
		base := c.address(at)
		status, payload, err := c.once(ctx, r, base, data, perTry)
		if err != nil {
			if ctx.Err() != nil {
				return true, nil, ctx.Err()
			}
			last = err
			c.next(at)
			continue
		}
		if status == http.StatusServiceUnavailable {
			last = notServing(base, payload)
			if !isStorage(last) {
				c.next(at) // a standby, or a node starting: the next one
			}
			continue
		}
		if status >= 400 {
			return true, nil, errorOf(status, payload)
		}
		trimmed := bytes.TrimSpace(payload)
		if len(trimmed) == 0 || trimmed[0] != '{' {
			return true, nil, unexpected(base, payload, nil)
		}
		if err := json.Unmarshal(trimmed, out); err != nil {
			return true, nil, unexpected(base, payload, err)
		}
		return true, nil, nil
	}
	return false, last, nil
}

// once sends r to one node and reads the whole answer, within perTry.
func (c *Client) once(ctx context.Context, r request, base string, data []byte, perTry time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, perTry)
	defer cancel()
	target := base + r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}
	var body io.Reader
	if data != nil {
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return 0, nil, err
	}
	if data != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	c.authorize(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	payload, err := io.ReadAll(resp.Body) // a node that dies mid-body is no answer
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, payload, nil
}

func (c *Client) authorize(req *http.Request) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
}

// address is the address at index at of the rotation.
func (c *Client) address(at int64) string {
	n := int64(len(c.addresses))
	return c.addresses[((at%n)+n)%n]
}

// next moves the rotation on from at, unless another call did meanwhile.
func (c *Client) next(at int64) {
	c.current.CompareAndSwap(at, at+1)
}

// unavailable is the error of a call no node answered: the storage error of a node
// that serves but could not commit, else ErrUnavailable.
func (c *Client) unavailable(last error) error {
	if isStorage(last) {
		return last
	}
	return &Error{
		Status: 503, Code: "unavailable", Kind: ErrUnavailable, Retryable: true, Cause: last,
		Message: fmt.Sprintf("no Dex Server answered at %s: %v", strings.Join(c.addresses, ", "), last),
	}
}

func unexpected(base string, payload []byte, cause error) error {
	return &Error{
		Status: 200, Code: "server_error", Kind: ErrServer, Cause: cause,
		Message: fmt.Sprintf("unexpected answer from %s: %s", base, clip(payload)),
	}
}

var (
	jitterMu sync.Mutex
	jitter   = rand.New(rand.NewSource(time.Now().UnixNano()))
)

// backoff is the wait before try number attempt+1: full jitter, uniform in [0,
// min(most, initial * 2^(attempt-1))).
func backoff(attempt int, initial, most time.Duration) time.Duration {
	high := most
	if attempt < 32 {
		if d := initial << (attempt - 1); d < most {
			high = d
		}
	}
	jitterMu.Lock()
	defer jitterMu.Unlock()
	return time.Duration(jitter.Float64() * float64(high))
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
