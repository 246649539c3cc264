/*
 * test_csv.c - CUnit suite for the CSV importer (io/csv.c): values and
 * labels read back from the dataset it writes.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <stdint.h>
#include <string.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/csv.h"
#include "core/status.h"

/* ---- the .npy and CSV importers ------------------------------------------- */

static void test_csv_values(void)
{
    char in[4096], out[4096];
    tpath(in, sizeof in, "v.csv");
    tpath(out, sizeof out, "v-csv.h5");
    FILE *f = fopen(in, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("f1, cls ,f2\n\n1.5,1,-2\r\n0.25,0,1e3\n-7, 2 ,0\n", f);
    fclose(f);
    float want[6] = {1.5f, -2.0f, 0.25f, 1000.0f, -7.0f, 0.0f};
    int32_t labels[3] = {1, 0, 2};
    struct dt_csv_import_opts o = {.train = in, .out_path = out, .label_column = "cls"};
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_OK);
    check_values(out, "train", 3, 2, want, labels);

    o.label_column = "4";
    o.overwrite = 1;
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_ERR_USAGE);
    ASSERT_MSG("columns 1 to 3");
    o.label_column = "2";
    o.header = DT_CSV_HEADER_NO;
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("line 1, column 1: 'f1' is not a number");
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_csv", io_suite_init, NULL);
    CU_ADD(s, test_csv_values);
    return io_run_all();
}
