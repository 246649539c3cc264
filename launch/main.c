#include <stdio.h>
int main(void) { fprintf(stderr, "dtrain: not built yet\n"); return 70; }
