package market

import (
	"fmt"
	"strings"
	"time"
)

// Result is one cell of the table: one load run with one variant.
// Counts cover calls that completed before the deadline; calls still running
// at the deadline are counted only in InFlight (and their effects in
// LateListed and LateBought, which the conservation check needs).
type Result struct {
	Load    Load   `json:"load"`
	Variant string `json:"variant"`
	// Label is the book's wording for the row ("WATCH", "coarse lock"...).
	Label string `json:"label"`
	// Improved is true for rows that are not in the book.
	Improved bool   `json:"improved"`
	Pick     string `json:"pick"`
	// Round is the round the cell ran in, from 1 (see Config.Rounds).
	Round int `json:"round"`
	// Skipped says why the cell did not run (empty if it ran).
	Skipped string `json:"skipped,omitempty"`

	// Duration is the configured length of the cell; Elapsed runs from the
	// start barrier until the last worker stopped (in-flight calls
	// included).
	Duration time.Duration `json:"duration_ns"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	// Inventory is the number of items each seller started with.
	Inventory int64 `json:"inventory"`

	Listed       int64 `json:"listed"`
	Bought       int64 `json:"bought"`
	Retries      int64 `json:"retries"`       // aborted EXECs of purchases
	ListRetries  int64 `json:"list_retries"`  // aborted EXECs of listings
	Gone         int64 `json:"gone"`          // purchases that found the entry gone
	NoFunds      int64 `json:"no_funds"`      // purchases the buyer could not pay
	Timeouts     int64 `json:"timeouts"`      // purchases that gave up (10 s)
	ListTimeouts int64 `json:"list_timeouts"` // listings that gave up (5 s)
	// LockFailures counts lock attempts that did not obtain the lock:
	// failed SETNX polls for the book's lock, Locker errors for dlock rows.
	LockFailures int64 `json:"lock_failures"`
	// LockHeld is the time locks were held before the deadline, summed
	// over workers, from obtaining a lock to starting its release (0 for
	// the rows without a lock). For a coarse row, which has one lock, it
	// is how long that lock was in use: a lock handed straight from one
	// holder to the next is held nearly all of Duration.
	LockHeld time.Duration `json:"lock_held_ns"`
	// LockSections is the number of critical sections (lock holdings)
	// LockHeld sums, listings' and purchases' alike.
	LockSections int64 `json:"lock_sections"`
	// CriticalSection is the mean time one critical section took, measured
	// inside the lock (LockHeld ÷ LockSections; 0 for rows without a lock).
	CriticalSection time.Duration `json:"critical_section_ns"`
	// CeilingShare is, for a coarse row (one lock for the whole market),
	// the critical sections it ran per second as a share of the most one
	// lock allows: sections back to back, 1 ÷ CriticalSection per second.
	// 1 means no time at all between one holder's release and the next
	// holder's start. 0 for the other rows.
	CeilingShare float64 `json:"ceiling_share"`
	// AcquireMean is the mean wall time of a successful lock acquisition
	// (waiting included), ReleaseMean that of a release: with
	// CriticalSection, where a locked call's time goes. 0 without a lock.
	AcquireMean time.Duration `json:"acquire_mean_ns"`
	ReleaseMean time.Duration `json:"release_mean_ns"`
	// UnlockFailures counts releases that found the lock no longer held by
	// the releaser; any is a failed check.
	UnlockFailures int64 `json:"unlock_failures"`
	// Calls is the number of purchase calls that completed before the
	// deadline, whatever their outcome.
	Calls int64 `json:"purchase_calls"`
	// ListCalls is the same for listings.
	ListCalls int64 `json:"list_calls"`
	// InFlight is the number of calls (listings and purchases) running at
	// the deadline.
	InFlight   int64 `json:"in_flight"`
	LateListed int64 `json:"late_listed"` // in-flight listings that succeeded
	LateBought int64 `json:"late_bought"` // in-flight purchases that succeeded

	// Success is the latency of successful purchases, All of every purchase
	// call (gone, no funds and timeouts included).
	Success Latency `json:"latency_success"`
	All     Latency `json:"latency_all"`
	// BookWait is the book's "average wait per purchase":
	// buyers × duration ÷ bought (0 if nothing was bought).
	BookWait time.Duration `json:"book_wait_ns"`

	// Commands is the number of commands the server processed while the
	// workers ran (INFO commandstats difference; commands run by scripts
	// included), CommandCalls the same per command.
	Commands     int64            `json:"commands"`
	CommandCalls map[string]int64 `json:"command_calls,omitempty"`
	OpsPerSec    float64          `json:"ops_per_sec"`
	// CommandUsec is the microseconds Redis spent in each command (a
	// script's time includes that of the commands it ran).
	CommandUsec map[string]int64 `json:"command_usec,omitempty"`
	// RoundTrips is the number of requests the server read from its
	// clients (INFO stats total_reads_processed: a pipeline or MULTI..EXEC
	// sent at once is one), RedisCPU the CPU time the server used, ClientCPU
	// that of this process (every worker and Locker; 0 where it cannot be
	// read). All three cover the row from its start to its last call; 0 on
	// a server that does not report them.
	RoundTrips int64         `json:"round_trips"`
	RedisCPU   time.Duration `json:"redis_cpu_ns"`
	ClientCPU  time.Duration `json:"client_cpu_ns"`
	// FinalZCard is the number of entries left in the market.
	FinalZCard int64 `json:"final_zcard"`

	// Valid is false when the run could not measure what it should (a
	// lister ran out of inventory); Invalid says why.
	Valid   bool   `json:"valid"`
	Invalid string `json:"invalid,omitempty"`
	// Check is the conservation check's verdict (nil: passed).
	Check      error  `json:"-"`
	CheckError string `json:"check_error,omitempty"`
	// Notes are remarks about the cell (first lock error, reruns...).
	Notes []string `json:"notes,omitempty"`
}

// ran reports whether the cell ran (was not skipped).
func (r Result) ran() bool { return r.Skipped == "" }

// CheckError is returned by Run when at least one cell failed its
// conservation check. Cells names each failed cell and what did not balance;
// the Results Run returns alongside carry the same in Check.
type CheckError struct {
	Cells []string
}

// Error lists every failed cell.
func (e *CheckError) Error() string {
	return fmt.Sprintf("market: conservation check failed in %d cell(s): %s", len(e.Cells), strings.Join(e.Cells, "; "))
}
