package dex

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The environment variables a Worker reads for the options not set in code, the names
// the Python and TypeScript Workers read. Durations are in seconds, decimals allowed
// ("0.5"); an empty variable counts as unset.
const (
	envAddress           = "DEX_ADDRESS"
	envCapacity          = "DEX_WORKER_CAPACITY"
	envToken             = "DEX_WORKER_TOKEN"
	envWorkerID          = "DEX_WORKER_ID"
	envHeartbeatInterval = "DEX_WORKER_HEARTBEAT_INTERVAL"
	envReconnectInitial  = "DEX_WORKER_RECONNECT_INITIAL"
	envReconnectMax      = "DEX_WORKER_RECONNECT_MAX"
	envConnectTimeout    = "DEX_WORKER_CONNECT_TIMEOUT"
	envPingInterval      = "DEX_WORKER_PING_INTERVAL"
	envDrainTimeout      = "DEX_DRAIN_TIMEOUT"
	envTracing           = "DEX_TRACING"
	envLogFormat         = "DEX_LOG_FORMAT"
	envLogLevel          = "DEX_LOG_LEVEL"
)

// The defaults of the options that neither code nor the environment sets.
const (
	defaultAddress           = "http://127.0.0.1:7450" // dex server's default --listen
	defaultCapacity          = 16
	defaultHeartbeatInterval = time.Second
	defaultReconnectInitial  = 100 * time.Millisecond
	defaultReconnectMax      = time.Second
	defaultConnectTimeout    = 3 * time.Second
	defaultPingInterval      = 2 * time.Second
	defaultDrainTimeout      = 30 * time.Second
	maxCapacity              = 100_000 // as the Python Worker's
)

// resolve fills each option left at its zero value from its environment variable, or
// else its default. A variable that does not parse, or is out of range, gets the
// default too, and the error names it and its value.
func (o WorkerOptions) resolve(getenv func(string) string) (WorkerOptions, error) {
	env := envReader{getenv: getenv}
	if o.Address == "" {
		o.Address = env.text(envAddress)
	}
	if o.Address == "" {
		o.Address = defaultAddress
	}
	if o.Token == "" {
		o.Token = env.text(envToken)
	}
	if o.WorkerID == "" {
		o.WorkerID = env.text(envWorkerID)
	}
	o.Capacity = env.count(o.Capacity, envCapacity, defaultCapacity)
	o.HeartbeatInterval = env.seconds(o.HeartbeatInterval, envHeartbeatInterval, defaultHeartbeatInterval, false)
	o.ReconnectInitial = env.seconds(o.ReconnectInitial, envReconnectInitial, defaultReconnectInitial, false)
	o.ReconnectMax = env.seconds(o.ReconnectMax, envReconnectMax, defaultReconnectMax, false)
	o.ConnectTimeout = env.seconds(o.ConnectTimeout, envConnectTimeout, defaultConnectTimeout, false)
	o.PingInterval = env.seconds(o.PingInterval, envPingInterval, defaultPingInterval, false)
	// a drain that waits for nothing is a choice: DEX_DRAIN_TIMEOUT=0 holds
	o.DrainTimeout = env.seconds(o.DrainTimeout, envDrainTimeout, defaultDrainTimeout, true)
	if !o.Tracing {
		o.Tracing = env.on(envTracing)
	}
	o.LogFormat = env.choice(o.LogFormat, "LogFormat", envLogFormat, []string{LogConsole, LogJSON}, LogConsole, "log format")
	o.LogLevel = env.choice(o.LogLevel, "LogLevel", envLogLevel, logLevels, "info", "log level")
	if len(addressList(o.Address)) == 0 {
		env.problems = append(env.problems, "no server address: set WorkerOptions.Address or "+envAddress)
	}
	if len(env.problems) > 0 {
		return o, errors.New("dex: " + strings.Join(env.problems, "; "))
	}
	return o, nil
}

// addressList splits a comma-separated address option into its addresses.
func addressList(option string) []string {
	var list []string
	for _, address := range strings.Split(option, ",") {
		if address = strings.TrimSpace(address); address != "" {
			list = append(list, address)
		}
	}
	return list
}

// envReader reads options from the environment and notes each bad value.
type envReader struct {
	getenv   func(string) string
	problems []string
}

func (e *envReader) text(name string) string {
	return strings.TrimSpace(e.getenv(name))
}

func (e *envReader) bad(name, value, want string) {
	e.problems = append(e.problems, fmt.Sprintf("%s=%q: %s", name, value, want))
}

// count is the option set in code (> 0), or else the whole number in the variable, or
// else the fallback.
func (e *envReader) count(set int, name string, fallback int) int {
	if set > 0 {
		return set
	}
	value := e.text(name)
	if value == "" {
		return fallback
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 || n > maxCapacity {
		e.bad(name, value, fmt.Sprintf("want a whole number from 1 to %d", maxCapacity))
		return fallback
	}
	return n
}

// seconds is the option set in code (> 0), or else the variable's seconds (> 0, or >= 0
// with zeroOK), or else the fallback.
func (e *envReader) seconds(set time.Duration, name string, fallback time.Duration, zeroOK bool) time.Duration {
	if set > 0 {
		return set
	}
	value := e.text(name)
	if value == "" {
		return fallback
	}
	want := "want a number of seconds above 0, such as 0.5"
	if zeroOK {
		want = "want a number of seconds, 0 or more, such as 0.5"
	}
	s, err := strconv.ParseFloat(value, 64)
	if err != nil || math.IsNaN(s) || s < 0 || (s == 0 && !zeroOK) || s > math.MaxInt64/float64(time.Second) {
		e.bad(name, value, want)
		return fallback
	}
	return time.Duration(s * float64(time.Second))
}

// on is whether the variable turns a switch on: the words the Python Worker's settings
// take, in any case ("true", "1", "yes", "on", "t", "y"; or "false", "0", "no", "off",
// "f", "n"). Another value is off, and noted.
func (e *envReader) on(name string) bool {
	value := e.text(name)
	switch strings.ToLower(value) {
	case "":
		return false
	case "1", "true", "t", "yes", "y", "on":
		return true
	case "0", "false", "f", "no", "n", "off":
		return false
	}
	e.bad(name, value, "want true or false (or 1/0, yes/no, on/off)")
	return false
}

// choice is the option set in code, or else the variable's value (in any case), or else
// the fallback; a value that is none of the choices is noted, and the fallback taken.
func (e *envReader) choice(set, option, name string, choices []string, fallback, what string) string {
	value, source := set, "WorkerOptions."+option
	if value == "" {
		value, source = e.text(name), name
	}
	if value == "" {
		return fallback
	}
	for _, c := range choices {
		if strings.EqualFold(value, c) {
			return c
		}
	}
	want := strings.Join(choices[:len(choices)-1], ", ") + " or " + choices[len(choices)-1]
	e.bad(source, value, what+": choose "+want)
	return fallback
}
