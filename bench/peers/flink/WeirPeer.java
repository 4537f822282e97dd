// weir's two benchmark jobs on Apache Flink's local MiniCluster, for a
// side-by-side comparison with `weir bench`. See README.md in this folder.
//
// Compiled and run by run.sh against the jars of the `apache-flink` PyPI
// wheel: javac -cp "pyflink/lib/*" WeirPeer.java; java -cp "pyflink/lib/*:." WeirPeer ...

import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.java.tuple.Tuple4;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.WebOptions;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.runtime.checkpoint.AbstractCheckpointStats;
import org.apache.flink.runtime.checkpoint.CheckpointStatsSnapshot;
import org.apache.flink.runtime.checkpoint.CheckpointStatsStatus;
import org.apache.flink.runtime.checkpoint.FailedCheckpointStats;
import org.apache.flink.runtime.checkpoint.TaskStateStats;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

public class WeirPeer {

    /** One record: key, value, emission time (System.nanoTime), global sequence number. */
    public static final class Event extends Tuple4<Long, Long, Long, Long> {
        public Event() {}

        Event(long key, long value, long emittedNs, long seq) {
            super(key, value, emittedNs, seq);
        }
    }

    // ---------------------------------------------------------------- settings

    static String pipelines = "stateless,keyed";
    static String modes = "none,aligned,unaligned,at-least-once";
    static long events = 20_000_000L;
    static double rate = 0; // records/s in total; 0 = closed loop (full speed)
    static long keys = 10_000;
    static int parallelism = 2;
    static long intervalMs = 1000;
    static long bufferTimeoutMs = 100; // Flink's default
    static long warmupEvents = -1; // -1: min(events / 10, 2 M); 0: none
    static String checkpointDir = System.getProperty("java.io.tmpdir") + "/weir-peer-flink";
    static String jsonPath = null;

    // ------------------------------------------------- per-run shared results
    // The MiniCluster runs every task in this JVM (and, with no user jars,
    // loads this class once), so subtasks report through static fields.

    static final Histogram LATENCY = new Histogram();
    static final AtomicLong FIRST_EMIT = new AtomicLong(Long.MAX_VALUE);
    static final AtomicLong LAST_SINK = new AtomicLong(Long.MIN_VALUE);
    static final AtomicLong SINK_RECORDS = new AtomicLong();
    static final java.util.regex.Pattern NOT_RUNNING = java.util.regex.Pattern.compile(
            "unknown task|suspending|task is closing|tasks not ready|not being executed|finished", java.util.regex.Pattern.CASE_INSENSITIVE);
    static final List<Long> SOURCE_COUNTS = Collections.synchronizedList(new ArrayList<>());

    static void resetShared() {
        LATENCY.clear();
        FIRST_EMIT.set(Long.MAX_VALUE);
        LAST_SINK.set(Long.MIN_VALUE);
        SINK_RECORDS.set(0);
        SOURCE_COUNTS.clear();
    }

    // ------------------------------------------------------------- operators

    static long splitmix64(long x) {
        long z = x + 0x9e3779b97f4a7c15L;
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    /**
     * Turns a sequence number into an event and stamps it (chained to the
     * sequence source, so this is the emission). Closed loop: stamped with
     * System.nanoTime(). Open loop: this subtask's k-th record is due at
     * origin + k * parallelism / rate and is stamped with that scheduled
     * time (no coordinated omission); it parks while more than 100 µs early
     * and yields while less.
     */
    public static final class Generate extends RichMapFunction<Long, Event> {
        final long keys;
        final double periodNs; // per subtask; 0 = full speed
        final long seedMix = splitmix64(1);
        long origin;
        long k;

        Generate(long keys, double rate, int parallelism) {
            this.keys = keys;
            this.periodNs = rate > 0 ? 1e9 * parallelism / rate : 0;
        }

        @Override
        public Event map(Long seq) {
            long now = System.nanoTime();
            if (k == 0) {
                origin = now;
                FIRST_EMIT.accumulateAndGet(now, Math::min);
            }
            long stamp = now;
            if (periodNs > 0) {
                stamp = origin + (long) (k * periodNs);
                while (now < stamp) {
                    if (stamp - now > 100_000) LockSupport.parkNanos(stamp - now - 60_000);
                    else Thread.yield();
                    now = System.nanoTime();
                }
            }
            k++;
            long r = splitmix64(seq ^ seedMix);
            // Multiply-shift: the high word of r * keys (unsigned), as weir does.
            long key = Math.multiplyHigh(r, keys) + ((r >> 63) & keys);
            return new Event(key, seq, stamp, seq);
        }

        @Override
        public void close() {
            SOURCE_COUNTS.add(k);
        }
    }

    /** Running sum of the values per key, in ValueState (HashMap state backend). */
    public static final class RunningSum extends KeyedProcessFunction<Long, Event, Event> {
        transient ValueState<Long> sum;

        @Override
        public void open(OpenContext ctx) {
            sum = getRuntimeContext().getState(new ValueStateDescriptor<>("sum", Long.class));
        }

        @Override
        public void processElement(Event e, Context ctx, Collector<Event> out) throws Exception {
            Long s = sum.value();
            long next = (s == null ? 0 : s) + e.f1;
            sum.update(next);
            out.collect(new Event(e.f0, next, e.f2, e.f3));
        }
    }

    /** Records nanoTime() - emission per record; merges into LATENCY on close. */
    public static final class LatencySink implements Sink<Event> {
        @Override
        public SinkWriter<Event> createWriter(WriterInitContext ctx) {
            return new SinkWriter<Event>() {
                final Histogram h = new Histogram();
                long count;
                long last = Long.MIN_VALUE;

                @Override
                public void write(Event e, Context c) {
                    long now = System.nanoTime();
                    h.record(now - e.f2);
                    last = now;
                    count++;
                }

                @Override
                public void flush(boolean endOfInput) {}

                @Override
                public void close() {
                    LATENCY.merge(h);
                    SINK_RECORDS.addAndGet(count);
                    LAST_SINK.accumulateAndGet(last, Math::max);
                }
            };
        }
    }

    /**
     * A log-linear histogram of nanoseconds: exact below 128, then 64
     * sub-buckets per power of two (at most 1.6 % relative error), like
     * HdrHistogram with two significant digits.
     */
    static final class Histogram {
        static final int SUB = 6;
        final long[] counts = new long[64 << SUB];
        long total;
        long max;

        static int index(long v) {
            if (v < (2L << SUB)) return (int) v;
            int shift = 63 - Long.numberOfLeadingZeros(v) - SUB;
            return ((shift + 1) << SUB) + (int) ((v >>> shift) & ((1 << SUB) - 1));
        }

        static long lowest(int i) {
            if (i < (2 << SUB)) return i;
            int shift = (i >>> SUB) - 1;
            return ((long) ((1 << SUB) + (i & ((1 << SUB) - 1)))) << shift;
        }

        void record(long v) {
            if (v < 0) v = 0;
            counts[index(v)]++;
            total++;
            if (v > max) max = v;
        }

        synchronized void merge(Histogram o) {
            for (int i = 0; i < counts.length; i++) counts[i] += o.counts[i];
            total += o.total;
            max = Math.max(max, o.max);
        }

        synchronized void clear() {
            java.util.Arrays.fill(counts, 0);
            total = 0;
            max = 0;
        }

        /** Highest value in the bucket holding quantile q (as HdrHistogram reports). */
        synchronized long valueAt(double q) {
            if (total == 0) return 0;
            long rank = Math.max(1, (long) Math.ceil(q * total));
            long seen = 0;
            for (int i = 0; i < counts.length; i++) {
                seen += counts[i];
                if (seen >= rank) return Math.min(max, lowest(i + 1) - 1);
            }
            return max;
        }
    }

    // ------------------------------------------------------------------- job

    static StreamExecutionEnvironment environment(String mode, String pipeline) {
        Configuration job = new Configuration();
        job.set(StateBackendOptions.STATE_BACKEND, "hashmap");
        job.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
        job.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY,
                "file://" + checkpointDir + "/" + pipeline + "-" + mode);
        if (!mode.equals("none")) {
            job.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(intervalMs));
            job.set(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE,
                    mode.equals("at-least-once") ? CheckpointingMode.AT_LEAST_ONCE : CheckpointingMode.EXACTLY_ONCE);
            job.set(CheckpointingOptions.ENABLE_UNALIGNED, mode.equals("unaligned"));
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(job);
        env.setParallelism(parallelism);
        env.setBufferTimeout(bufferTimeoutMs);
        return env;
    }

    static void build(StreamExecutionEnvironment env, String pipeline, long n) {
        DataStream<Event> gen = env.fromSequence(0, n - 1).name("sequence")
                .map(new Generate(keys, rate, parallelism)).name("generator");
        DataStream<Event> out;
        if (pipeline.equals("stateless")) {
            // As weir's stateless job: map, then drop sequence numbers 15, 31, 47, ...
            out = gen.map(e -> new Event(e.f0, e.f1 * 3 + 1, e.f2, e.f3)).returns(Event.class).name("map")
                    .filter(e -> e.f3 % 16 != 15).name("filter");
        } else if (pipeline.equals("keyed")) {
            out = gen.keyBy(e -> e.f0, org.apache.flink.api.common.typeinfo.Types.LONG)
                    .process(new RunningSum()).name("running-sum");
        } else {
            throw new IllegalArgumentException("unknown pipeline " + pipeline);
        }
        out.sinkTo(new LatencySink()).name("latency-sink");
    }

    static long expected(String pipeline, long n) {
        return pipeline.equals("stateless") ? n - n / 16 : n;
    }

    /** Runs one job to the end and returns its JSON row (or null for a warm-up). */
    static String runOne(MiniCluster mc, String pipeline, String mode, long n, boolean report) throws Exception {
        resetShared();
        StreamExecutionEnvironment env = environment(mode, pipeline);
        build(env, pipeline, n);
        JobID id = mc.submitJob(env.getStreamGraph().getJobGraph()).get().getJobID();
        JobResult result = mc.requestJobResult(id).get();
        if (!result.isSuccess()) {
            throw new RuntimeException("job failed", result.getSerializedThrowable()
                    .map(t -> (Throwable) t).orElse(null));
        }
        CheckpointStatsSnapshot stats = mc.getArchivedExecutionGraph(id).get().getCheckpointStatsSnapshot();
        long delivered = SINK_RECORDS.get();
        if (delivered != expected(pipeline, n)) {
            throw new RuntimeException(delivered + " records reached the sinks, expected " + expected(pipeline, n));
        }
        if (!report) return null;
        if (rate > 0 && SOURCE_COUNTS.size() == parallelism) {
            long lo = Collections.min(SOURCE_COUNTS), hi = Collections.max(SOURCE_COUNTS);
            if (hi > 2 * lo) System.err.printf("warning: unbalanced source subtasks %s: the open-loop rate is off%n", SOURCE_COUNTS);
        }

        double seconds = (LAST_SINK.get() - FIRST_EMIT.get()) / 1e9;
        Row r = new Row();
        r.pipeline = pipeline;
        r.mode = mode;
        r.events = n;
        r.sinkRecords = delivered;
        r.seconds = seconds;
        r.jobSeconds = result.getNetRuntime() / 1e3;
        r.eventsPerSec = n / seconds;
        r.p50 = LATENCY.valueAt(0.50) / 1e3;
        r.p99 = LATENCY.valueAt(0.99) / 1e3;
        r.p999 = LATENCY.valueAt(0.999) / 1e3;
        r.max = LATENCY.max / 1e3;
        if (!mode.equals("none")) {
            r.checkpoints = true;
            r.completed = stats.getCounts().getNumberOfCompletedCheckpoints();
            r.failed = stats.getCounts().getNumberOfFailedCheckpoints();
            List<Long> durations = new ArrayList<>();
            List<Long> alignments = new ArrayList<>();
            // Failures that only say a task was not running: the bounded job
            // was starting or finishing. Failures to trigger have no history
            // entry (seen: "triggering task ... is not being executed at the
            // moment", right after the job starts) and count here too.
            long inHistory = 0;
            for (AbstractCheckpointStats c : stats.getHistory().getCheckpoints()) {
                if (c instanceof FailedCheckpointStats) {
                    inHistory++;
                    String why = String.valueOf(((FailedCheckpointStats) c).getFailureMessage());
                    if (NOT_RUNNING.matcher(why).find()) r.failedStartOrEnd++;
                    System.err.printf("  (%s %s: checkpoint %d failed after %d ms: %s)%n", pipeline, mode,
                            c.getCheckpointId(), c.getEndToEndDuration(), why);
                }
                if (c.getStatus() != CheckpointStatsStatus.COMPLETED) continue;
                durations.add(c.getEndToEndDuration());
                long align = 0;
                for (TaskStateStats t : c.getAllTaskStateStats()) {
                    align = Math.max(align, t.getSummaryStats().getAlignmentDurationStats().getMaximum());
                }
                alignments.add(align);
                r.channelStateBytes += c.getPersistedData();
            }
            if (stats.getHistory().getLatestCompletedCheckpoint() != null) {
                r.stateBytes = stats.getHistory().getLatestCompletedCheckpoint().getStateSize();
            }
            r.failedStartOrEnd += r.failed - inHistory;
            r.duration = percentiles(durations);
            r.alignment = percentiles(alignments);
        }
        System.out.println(r.tableRow());
        return r.json();
    }

    /** Nearest-rank p50, p99 and max of millisecond values (as weir does). */
    static double[] percentiles(List<Long> v) {
        if (v.isEmpty()) return new double[] {0, 0, 0};
        Collections.sort(v);
        int len = v.size();
        java.util.function.DoubleFunction<Double> rank =
                q -> (double) v.get(Math.min(len - 1, Math.max(1, (int) Math.ceil(q * len)) - 1));
        return new double[] {rank.apply(0.50), rank.apply(0.99), v.get(len - 1)};
    }

    static final class Row {
        String pipeline, mode;
        long events, sinkRecords, completed, failed, failedStartOrEnd, stateBytes, channelStateBytes;
        double seconds, jobSeconds, eventsPerSec, p50, p99, p999, max;
        boolean checkpoints;
        double[] duration, alignment;

        static String header() {
            return String.format(Locale.ROOT, "%-10s %-13s %3s %12s %8s %11s %9s %9s %9s %9s %9s %9s %9s",
                    "pipeline", "mode", "par", "events", "seconds", "events/s", "p50 µs", "p99 µs", "p99.9 µs",
                    "max µs", "ckpts ok/f", "ckpt p50", "ckpt p99");
        }

        String tableRow() {
            String n = "-", c50 = "-", c99 = "-";
            if (checkpoints) {
                n = completed + "/" + failed + (failed > 0 && failed == failedStartOrEnd ? "*" : "");
                c50 = String.format(Locale.ROOT, "%.0fms", duration[0]);
                c99 = String.format(Locale.ROOT, "%.0fms", duration[1]);
            }
            return String.format(Locale.ROOT, "%-10s %-13s %3d %12d %8.3f %11s %9.1f %9.1f %9.1f %9.1f %10s %9s %9s",
                    pipeline, mode, parallelism, events, seconds, si(eventsPerSec), p50, p99, p999, max, n, c50, c99);
        }

        String json() {
            StringBuilder b = new StringBuilder();
            b.append(String.format(Locale.ROOT,
                    "{\"engine\":\"flink\",\"flink_version\":\"%s\",\"pipeline\":\"%s\",\"mode\":\"%s\",\"parallelism\":%d,"
                            + "\"keys\":%d,\"rate\":%s,\"events\":%d,\"sink_records\":%d,\"seconds\":%.6f,\"job_seconds\":%.3f,"
                            + "\"events_per_sec\":%.1f,\"buffer_timeout_ms\":%d,"
                            + "\"latency_us\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f,\"max\":%.3f}",
                    org.apache.flink.runtime.util.EnvironmentInformation.getVersion(), pipeline, mode, parallelism, keys,
                    rate > 0 ? String.valueOf(rate) : "null", events, sinkRecords, seconds, jobSeconds, eventsPerSec,
                    bufferTimeoutMs, p50, p99, p999, max));
            if (checkpoints) {
                b.append(String.format(Locale.ROOT,
                        ",\"checkpoints\":{\"completed\":%d,\"failed\":%d,\"failed_while_starting_or_finishing\":%d,\"duration_ms\":{\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
                                + "\"alignment_ms\":{\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},\"state_bytes\":%d,\"channel_state_bytes\":%d}",
                        completed, failed, failedStartOrEnd, duration[0], duration[1], duration[2], alignment[0], alignment[1], alignment[2],
                        stateBytes, channelStateBytes));
            }
            b.append(String.format(Locale.ROOT, ",\"machine\":{\"cores\":%d,\"unix_time\":%d}}",
                    Runtime.getRuntime().availableProcessors(), System.currentTimeMillis() / 1000));
            return b.toString();
        }
    }

    static String si(double v) {
        if (v >= 1e9) return String.format(Locale.ROOT, "%.2f G", v / 1e9);
        if (v >= 1e6) return String.format(Locale.ROOT, "%.2f M", v / 1e6);
        if (v >= 1e3) return String.format(Locale.ROOT, "%.1f k", v / 1e3);
        return String.format(Locale.ROOT, "%.0f", v);
    }

    // ------------------------------------------------------------------ main

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            String v = i + 1 < args.length ? args[i + 1] : null;
            switch (a) {
                case "--pipelines": pipelines = v; i++; break;
                case "--modes": modes = v; i++; break;
                case "--events": events = Long.parseLong(v.replace("_", "")); i++; break;
                case "--rate": rate = Double.parseDouble(v); i++; break;
                case "--keys": keys = Long.parseLong(v); i++; break;
                case "--parallelism": parallelism = Integer.parseInt(v); i++; break;
                case "--checkpoint-interval-ms": intervalMs = Long.parseLong(v); i++; break;
                case "--buffer-timeout-ms": bufferTimeoutMs = Long.parseLong(v); i++; break;
                case "--warmup-events": warmupEvents = Long.parseLong(v); i++; break;
                case "--checkpoint-dir": checkpointDir = v; i++; break;
                case "--json": jsonPath = v; i++; break;
                default:
                    System.err.println("unknown argument " + a + "\nusage: WeirPeer [--pipelines stateless,keyed] "
                            + "[--modes none,aligned,unaligned,at-least-once] [--events N] [--rate EV_PER_S] [--keys K] "
                            + "[--parallelism P] [--checkpoint-interval-ms MS] [--buffer-timeout-ms MS] "
                            + "[--warmup-events N] [--checkpoint-dir DIR] [--json PATH]");
                    System.exit(2);
            }
        }
        if (warmupEvents < 0) warmupEvents = Math.min(events / 10, 2_000_000);

        Configuration cluster = new Configuration();
        cluster.set(WebOptions.CHECKPOINTS_HISTORY_SIZE, 100_000); // keep every checkpoint's statistics
        MiniClusterConfiguration mcc = new MiniClusterConfiguration.Builder()
                .setConfiguration(cluster).setNumTaskManagers(1).setNumSlotsPerTaskManager(parallelism).build();
        try (MiniCluster mc = new MiniCluster(mcc);
             PrintWriter json = jsonPath == null ? null : new PrintWriter(new FileWriter(jsonPath, true))) {
            mc.start();
            System.out.printf(Locale.ROOT, "Flink %s MiniCluster, parallelism %d, %s, %d keys, HashMap state backend, "
                            + "checkpoint interval %d ms, buffer timeout %d ms%n",
                    org.apache.flink.runtime.util.EnvironmentInformation.getVersion(), parallelism,
                    rate > 0 ? String.format(Locale.ROOT, "open loop at %.0f events/s", rate) : "closed loop",
                    keys, intervalMs, bufferTimeoutMs);
            for (String p : pipelines.split(",")) {
                if (warmupEvents > 0) {
                    System.out.printf("(warm-up: %s, %d events, not reported)%n", p, warmupEvents);
                    runOne(mc, p, "none", warmupEvents, false);
                }
            }
            System.out.println(Row.header());
            for (String p : pipelines.split(",")) {
                for (String m : modes.split(",")) {
                    String row = runOne(mc, p, m, events, true);
                    if (json != null) {
                        json.println(row);
                        json.flush();
                    }
                }
            }
            System.out.println("(seconds: first record emitted to last record at a sink; latency: emission to sink, "
                    + (rate > 0 ? "from the scheduled emission time" : "from the emission time") + ";\n"
                    + " ckpts: completed/failed as counted by Flink, * = every failure was a checkpoint Flink could not "
                    + "trigger or finish because a task was not running (the bounded job starting or finishing);\n"
                    + " ckpt p50/p99: Flink's end-to-end duration, trigger to the last acknowledgement)");
        }
    }
}
