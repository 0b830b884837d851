/*
 * clockshift: an LD_PRELOAD shim that moves a process's wall clock by an
 * offset its starter can change while it runs. internal/redistest builds it
 * with `cc -shared -fPIC` and starts redis-server with it to make the
 * server's clock jump (faults 9 and 10 of docs/SAFETY.md).
 *
 * Shifted: gettimeofday, time, and clock_gettime of CLOCK_REALTIME and
 * CLOCK_REALTIME_COARSE, which is every way Redis 7.0 reads the time of
 * day (mstime/ustime and TIME use gettimeofday). Other clocks (Redis's
 * monotonic clock, CLOCK_MONOTONIC) are passed through unchanged, as a
 * real clock step leaves them.
 *
 * The offset, in nanoseconds, is a little-endian int64 at the start of the
 * file named by $CLOCKSHIFT_FILE, mapped shared at start-up: a write to the
 * file takes effect at the process's next reading of the clock.
 *
 * Why raw system calls and no dlsym(RTLD_NEXT): libfaketime, which finds
 * the real functions with dlsym, hangs Debian's jemalloc-linked
 * redis-server (jemalloc reads the clock while it initialises, dlsym may
 * allocate). Nothing here allocates or resolves symbols; the cost is a
 * system call per reading instead of the vDSO.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *shift;

static void die(const char *why) {
	static const char head[] = "clockshift: ";
	(void)!write(2, head, sizeof head - 1);
	(void)!write(2, why, strlen(why));
	(void)!write(2, "\n", 1);
	_exit(70);
}

/* Runs before main: a process started with the shim but without a usable
 * offset file stops at once rather than run unshifted. */
__attribute__((constructor)) static void clockshift_init(void) {
	const char *path = getenv("CLOCKSHIFT_FILE");
	if (path == NULL || *path == '\0')
		die("CLOCKSHIFT_FILE is not set");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("cannot open $CLOCKSHIFT_FILE");
	void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		die("cannot map $CLOCKSHIFT_FILE (it must hold 8 bytes)");
	shift = p;
}

/* offset returns the current shift in nanoseconds. The writer replaces 8
 * bytes in one write; reading until two readings agree keeps a reading
 * made during that write from mixing old and new bytes. */
static int64_t offset(void) {
	if (shift == NULL)
		return 0;
	int64_t a = *shift, b;
	while ((b = *shift) != a)
		a = b;
	return a;
}

static void add(struct timespec *ts, int64_t ns) {
	int64_t sec = ns / 1000000000, rem = ns % 1000000000;
	ts->tv_sec += sec;
	ts->tv_nsec += rem;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	} else if (ts->tv_nsec < 0) {
		ts->tv_sec--;
		ts->tv_nsec += 1000000000;
	}
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, clk, ts);
	if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
		add(ts, offset());
	return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	(void)tz; /* obsolete: glibc fills nothing useful either */
	struct timespec ts; /* tv: declared non-null by glibc */
	long r = syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
	if (r != 0)
		return (int)r;
	add(&ts, offset());
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0)
		return (time_t)-1;
	add(&ts, offset());
	if (t != NULL)
		*t = ts.tv_sec;
	return ts.tv_sec;
}
