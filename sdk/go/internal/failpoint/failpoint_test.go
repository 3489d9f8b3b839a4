package failpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rearm arms spec for one test and disarms everything after it.
func rearm(t *testing.T, spec string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { _ = Arm("", "") })
	return dir, Arm(spec, dir)
}

func TestASpecItCannotReadIsRefusedByNameAndArmsNothing(t *testing.T) {
	cases := map[string]string{
		"worker.tool_running=pasue":             `"worker.tool_running=pasue": unknown action "pasue" (crash, pause or stop)`,
		"a=crash,worker.tool_running=Pause":     `"worker.tool_running=Pause": unknown action "Pause"`,
		"worker.tool_running=error":             `unknown action "error"`,
		"worker.tool_running":                   `"worker.tool_running": not NAME=ACTION`,
		"=crash":                                `"=crash": not NAME=ACTION`,
		"worker.tool_running=pause@0":           `the hit number "0" is not a positive integer`,
		"worker.tool_running=pause@two":         `the hit number "two" is not a positive integer`,
		"worker.tool_running=pause@arm":         `the hit number "arm" is not a positive integer`,
		"worker.run_model.before_output=crash@": `the hit number "" is not a positive integer`,
	}
	for spec, want := range cases {
		_, err := rearm(t, spec)
		if err == nil || !strings.HasPrefix(err.Error(), "DEX_FAILPOINTS: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error with %s", spec, err, want)
		}
		if Err() != err {
			t.Errorf("%s: Err() is %v, not the refusal", spec, Err())
		}
		if Armed() {
			t.Errorf("%s: a refused spec armed points", spec)
		}
	}
}

func TestAWellFormedSpecArmsItsPoints(t *testing.T) {
	if _, err := rearm(t, " a=crash, b=pause@3 ,c=stop,"); err != nil {
		t.Fatal(err)
	}
	if !Armed() || Err() != nil {
		t.Fatalf("armed %v, err %v", Armed(), Err())
	}
	want := map[string]point{"a": {"crash", 1, 0}, "b": {"pause", 3, 0}, "c": {"stop", 1, 0}}
	if len(points) != len(want) {
		t.Fatalf("points %v", points)
	}
	for name, p := range want {
		if got := points[name]; got == nil || *got != p {
			t.Errorf("%s: %+v, want %+v", name, got, p)
		}
	}
	if _, err := rearm(t, ""); err != nil || Armed() {
		t.Fatalf("an empty spec: armed %v, err %v", Armed(), err)
	}
}

func TestAPauseActsOnItsHitOnlyAndHoldsUntilReleased(t *testing.T) {
	dir, err := rearm(t, "p=pause@2")
	if err != nil {
		t.Fatal(err)
	}
	hit := filepath.Join(dir, "p.hit")
	Hit("other") // a point not armed does nothing
	Hit("p")     // the first hit of p does nothing either
	if _, err := os.Stat(hit); err == nil {
		t.Fatal("the first hit acted")
	}
	returned := make(chan struct{})
	go func() { Hit("p"); close(returned) }()
	deadline := time.After(5 * time.Second)
	for {
		if _, err := os.Stat(hit); err == nil {
			break
		}
		select {
		case <-returned:
			t.Fatal("the second hit returned without a release")
		case <-deadline:
			t.Fatal("the second hit wrote no p.hit")
		case <-time.After(2 * time.Millisecond):
		}
	}
	select {
	case <-returned:
		t.Fatal("the pause ended without a release")
	default:
	}
	if err := os.WriteFile(filepath.Join(dir, "p.release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("the pause did not end on its release")
	}
}

func TestUnarmedAHitAllocatesNothing(t *testing.T) {
	if _, err := rearm(t, ""); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { Hit("worker.tool_running") }); n != 0 {
		t.Fatalf("%v allocations a hit", n)
	}
}

func BenchmarkUnarmedHit(b *testing.B) {
	_ = Arm("", "")
	for i := 0; i < b.N; i++ {
		Hit("worker.tool_running")
	}
}
