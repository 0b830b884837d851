package main

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// durationFlag is a duration flag whose errors say what is expected: a
// value that does not parse, or lies outside min..max (max 0: no bound).
type durationFlag struct {
	d        *time.Duration
	min, max time.Duration
	example  string // a valid value, for the error: "10s"
}

// durationVar defines a durationFlag on fs with value d.
func durationVar(fs *flag.FlagSet, d *time.Duration, name string, value, min, max time.Duration, example, usage string) {
	*d = value
	fs.Var(durationFlag{d: d, min: min, max: max, example: example}, name, usage)
}

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return shortDuration(*f.d)
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return fmt.Errorf("want a duration such as %s (units ms, s, m, h)", f.example)
	case d < f.min && f.min <= 0:
		return errors.New("must not be negative")
	case d < f.min:
		return fmt.Errorf("must be at least %s", shortDuration(f.min))
	case f.max > 0 && d > f.max:
		return fmt.Errorf("must be at most %s", shortDuration(f.max))
	}
	*f.d = d
	return nil
}

// shortDuration is d as time.Duration prints it, without the zero units
// at its end: 8760h, 1m30s, 10s.
func shortDuration(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if t, ok := strings.CutSuffix(s, zero); ok && t != "" && !strings.HasSuffix(t, ".") && (t[len(t)-1] < '0' || t[len(t)-1] > '9') {
			s = t
		}
	}
	return s
}

// flagValueErr matches the flag package's error for a value its flag
// refused.
var flagValueErr = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): (.*)$`)

// flagError rewrites the flag package's `invalid value "0" for flag -ttl:
// must be at least 1ms` as `--ttl 0: must be at least 1ms`: the flag as the
// user typed it, then what is wrong.
func flagError(err error) error {
	if err == nil {
		return nil
	}
	m := flagValueErr.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	return fmt.Errorf("--%s %s: %s", m[2], m[1], m[3])
}
