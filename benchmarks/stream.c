/* Reference memory-bandwidth kernels for benchmarks/validate_ram.py (not STREAM's source).
 *
 * copy c=a, scale b=s*c, add c=a+b, triad a=b+s*c over double arrays of N elements,
 * OpenMP static schedule, best of REPS timed passes after one untimed pass.
 * Bytes per element counted like STREAM: 16, 16, 24, 24.
 *
 * Build: gcc -O3 -fopenmp -o stream benchmarks/stream.c
 * Run:   OMP_NUM_THREADS=<cores> ./stream <N> <REPS>
 * Prints one line: copy=<GB/s> scale=<GB/s> add=<GB/s> triad=<GB/s>
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static double best(double current, double t) { return t < current ? t : current; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 16L << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 6;
    double *a = malloc(n * sizeof(double));
    double *b = malloc(n * sizeof(double));
    double *c = malloc(n * sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory for %ld doubles\n", n);
        return 1;
    }
    const double s = 3.0;
    /* First touch in parallel so pages land near the threads that use them. */
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.0;
    }
    double t_copy = 1e30, t_scale = 1e30, t_add = 1e30, t_triad = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i];
        double t1 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) b[i] = s * c[i];
        double t2 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i] + b[i];
        double t3 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double t4 = omp_get_wtime();
        if (r == 0) continue; /* the first pass pays page faults and thread start-up */
        t_copy = best(t_copy, t1 - t0);
        t_scale = best(t_scale, t2 - t1);
        t_add = best(t_add, t3 - t2);
        t_triad = best(t_triad, t4 - t3);
    }
    double mb = (double)n / 1e9;
    printf("copy=%.3f scale=%.3f add=%.3f triad=%.3f\n", 16 * mb / t_copy, 16 * mb / t_scale,
           24 * mb / t_add, 24 * mb / t_triad);
    /* Keep the results observable so the compiler cannot drop the loops. */
    fprintf(stderr, "check %.1f\n", a[n / 2] + b[n / 3] + c[n / 4]);
    free(a);
    free(b);
    free(c);
    return 0;
}
