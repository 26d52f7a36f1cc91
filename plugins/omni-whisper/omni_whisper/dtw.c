/* The cheapest monotonic path through a cost matrix (dynamic time warping) for word timestamps:
   the same recurrence, tie rules and rounding as timing.monotonic_path_numpy, cell by cell
   (each cell needs only its left, upper and upper-left neighbours, so row order gives the same
   sums as that function's anti-diagonal order). */
#include <math.h>
#include <stdint.h>

/* cost: rows x cols, row-major. total ((rows + 1) x (cols + 1) floats) and move (as many bytes)
   are scratch. The path is written from its end to its start into path_rows / path_cols (room
   for rows + cols entries each); returns its length. */
int dtw_path(const double *cost, int rows, int cols, float *total, int8_t *move, int32_t *path_rows, int32_t *path_cols)
{
    const long w = (long)cols + 1;
    for (long k = 0; k < ((long)rows + 1) * w; k++) {
        total[k] = INFINITY;
        move[k] = 2;
    }
    total[0] = 0.0f;
    for (long i = 1; i <= rows; i++) {
        for (long j = 1; j <= cols; j++) {
            const float diag = total[(i - 1) * w + j - 1], down = total[(i - 1) * w + j], right = total[i * w + j - 1];
            float best;
            int8_t pick;
            if (diag < down && diag < right) {
                best = diag;
                pick = 0;
            } else if (down < diag && down < right) {
                best = down;
                pick = 1;
            } else {
                best = right;
                pick = 2;
            }
            /* the sum in double, stored as float, as numpy's float64 + float32 into a float32 array */
            total[i * w + j] = (float)(cost[(i - 1) * cols + j - 1] + (double)best);
            move[i * w + j] = pick;
        }
    }
    int n = 0;
    long i = rows, j = cols;
    while (i > 0 || j > 0) {
        path_rows[n] = (int32_t)(i - 1);
        path_cols[n] = (int32_t)(j - 1);
        n++;
        const int8_t step = (i == 0) ? 2 : (j == 0) ? 1 : move[i * w + j];
        if (step == 0) {
            i--;
            j--;
        } else if (step == 1) {
            i--;
        } else {
            j--;
        }
    }
    return n;
}
