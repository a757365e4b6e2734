/* A struct with a hole and a union, for rflayout's fuzz seeds. */
struct header {
    unsigned char kind;
    unsigned long long offset;
    union { int status; float ratio; } u;
    unsigned short lanes[3];
};
struct header rf_seed_header;
