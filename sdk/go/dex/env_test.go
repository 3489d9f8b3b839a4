package dex

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

var workerEnv = []string{
	envAddress, envCapacity, envToken, envWorkerID, envHeartbeatInterval,
	envReconnectInitial, envReconnectMax, envConnectTimeout, envPingInterval, envDrainTimeout,
	envTracing, envLogFormat, envLogLevel,
}

// setEnv sets the Worker's variables for one test: those not named are empty (unset).
func setEnv(t *testing.T, values map[string]string) {
	t.Helper()
	for _, name := range workerEnv {
		t.Setenv(name, values[name])
	}
}

func helloOf(t *testing.T, w *Worker) hello {
	t.Helper()
	var hellos []hello
	if err := json.Unmarshal(w.helloFrame(), &hellos); err != nil {
		t.Fatal(err)
	}
	return hellos[0]
}

var testAgents = []Agent{{Name: "a", Model: viewModel{}}}

func TestOptionsNotSetInCodeComeFromTheEnvironment(t *testing.T) {
	setEnv(t, map[string]string{
		envAddress: "http://dex-a:8000, http://dex-b:8000", envCapacity: "3", envToken: "w-secret",
		envWorkerID: "worker-7", envHeartbeatInterval: "0.25", envReconnectInitial: "0.05",
		envReconnectMax: "2", envConnectTimeout: "1.5", envPingInterval: "0.75", envDrainTimeout: "0",
		envTracing: " Yes ", envLogFormat: "JSON", envLogLevel: "debug",
	})
	w := NewWorker(WorkerOptions{Agents: testAgents})
	if w.config != nil {
		t.Fatal(w.config)
	}
	if h := helloOf(t, w); h.WorkerID != "worker-7" || h.Capacity != 3 {
		t.Fatalf("hello must name the worker id and capacity of the environment: %+v", h)
	}
	o := w.opts
	if got := addressList(o.Address); strings.Join(got, " ") != "http://dex-a:8000 http://dex-b:8000" || o.Token != "w-secret" {
		t.Fatalf("address %q, token %q", got, o.Token)
	}
	if !o.Tracing || w.tracer == nil {
		t.Fatal("DEX_TRACING=Yes turns tracing on")
	}
	if o.LogFormat != LogJSON || o.LogLevel != "debug" || !w.log.json || w.log.level != 0 {
		t.Fatalf("DEX_LOG_FORMAT=JSON and DEX_LOG_LEVEL=debug: got %q, %q", o.LogFormat, o.LogLevel)
	}
	want := map[string][2]time.Duration{
		envHeartbeatInterval: {o.HeartbeatInterval, 250 * time.Millisecond},
		envReconnectInitial:  {o.ReconnectInitial, 50 * time.Millisecond},
		envReconnectMax:      {o.ReconnectMax, 2 * time.Second},
		envConnectTimeout:    {o.ConnectTimeout, 1500 * time.Millisecond},
		envPingInterval:      {o.PingInterval, 750 * time.Millisecond},
		envDrainTimeout:      {o.DrainTimeout, 0}, // 0 there is a drain that waits for none
	}
	for name, got := range want {
		if got[0] != got[1] {
			t.Errorf("%s: got %v, want %v", name, got[0], got[1])
		}
	}
}

func TestOptionsSetNowhereTakeTheDefaults(t *testing.T) {
	setEnv(t, nil)
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: testAgents})
	o := w.opts
	if w.config != nil || o.Capacity != 16 || o.HeartbeatInterval != time.Second ||
		o.ReconnectInitial != 100*time.Millisecond || o.ReconnectMax != time.Second ||
		o.ConnectTimeout != 3*time.Second || o.PingInterval != 2*time.Second || o.DrainTimeout != 30*time.Second || o.Token != "" ||
		o.Tracing || w.tracer != nil || o.LogFormat != LogConsole || o.LogLevel != "info" {
		t.Fatalf("the defaults of the Python and TypeScript Workers, got %+v (%v)", o, w.config)
	}
	if o.WorkerID == "" {
		t.Fatal("a Worker without an id gets one")
	}
}

func TestAWorkerGivenNoAddressServesTheLocalServer(t *testing.T) {
	setEnv(t, nil)
	w := NewWorker(WorkerOptions{Agents: testAgents})
	if w.config != nil || w.opts.Address != "http://127.0.0.1:7450" {
		t.Fatalf("no Address and no DEX_ADDRESS: dex server's own address, got %q (%v)", w.opts.Address, w.config)
	}
}

func TestOptionsSetInCodeWinOverTheEnvironment(t *testing.T) {
	setEnv(t, map[string]string{
		envAddress: "http://from-env:1", envCapacity: "3", envToken: "env-token", envWorkerID: "env-id",
		envHeartbeatInterval: "9", envReconnectInitial: "9", envReconnectMax: "9",
		envConnectTimeout: "9", envPingInterval: "9", envDrainTimeout: "9", envTracing: "9",
		envLogFormat: "xml", envLogLevel: "loud",
	})
	code := WorkerOptions{
		Address: "http://from-code:1", Agents: testAgents, Capacity: 5, Token: "code-token", WorkerID: "code-id",
		HeartbeatInterval: time.Millisecond, ReconnectInitial: 2 * time.Millisecond, ReconnectMax: 3 * time.Millisecond,
		ConnectTimeout: 4 * time.Millisecond, DrainTimeout: 5 * time.Millisecond, PingInterval: 6 * time.Millisecond,
		Tracing: true, LogFormat: LogJSON, LogLevel: "warning",
	}
	w := NewWorker(code)
	got := w.opts
	got.Agents, code.Agents = nil, nil
	if w.config != nil || !reflect.DeepEqual(got, code) {
		t.Fatalf("every option set in code is kept: got %+v, want %+v (%v)", got, code, w.config)
	}
}

func TestAVariableThatDoesNotParseStopsRunNamingItAndItsValue(t *testing.T) {
	setEnv(t, map[string]string{
		envCapacity: "sixteen", envReconnectMax: "1s", envDrainTimeout: "-1", envHeartbeatInterval: "0",
		envConnectTimeout: "NaN", envPingInterval: "2s", envTracing: "maybe",
		envLogFormat: "xml", envLogLevel: "loud",
	})
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: testAgents})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := w.Run(ctx) // returns before it connects
	if err == nil {
		t.Fatal("Run must refuse variables that do not parse")
	}
	for _, want := range []string{
		`DEX_WORKER_CAPACITY="sixteen": want a whole number from 1 to 100000`,
		`DEX_WORKER_RECONNECT_MAX="1s": want a number of seconds above 0`,
		`DEX_DRAIN_TIMEOUT="-1": want a number of seconds, 0 or more`,
		`DEX_WORKER_HEARTBEAT_INTERVAL="0": want a number of seconds above 0`,
		`DEX_WORKER_CONNECT_TIMEOUT="NaN"`,
		`DEX_WORKER_PING_INTERVAL="2s": want a number of seconds above 0`,
		`DEX_TRACING="maybe": want true or false (or 1/0, yes/no, on/off)`,
		`DEX_LOG_FORMAT="xml": log format: choose console or json`,
		`DEX_LOG_LEVEL="loud": log level: choose debug, info, warning or error`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error must say %s: %v", want, err)
		}
	}
	// the same variables set in code instead: the environment is not read, nothing is wrong
	ok := NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", Agents: testAgents, Capacity: 1, ReconnectMax: time.Second,
		DrainTimeout: time.Second, HeartbeatInterval: time.Second, ConnectTimeout: time.Second,
		PingInterval: time.Second, Tracing: true, LogFormat: LogConsole, LogLevel: "info",
	})
	if ok.config != nil {
		t.Fatalf("options set in code leave the environment unread: %v", ok.config)
	}
}

func TestRunNeedsAnAddress(t *testing.T) {
	setEnv(t, map[string]string{envAddress: " , "})
	err := NewWorker(WorkerOptions{Agents: testAgents}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no server address: set WorkerOptions.Address or DEX_ADDRESS") {
		t.Fatalf("a Worker with no address must say so: %v", err)
	}
}
