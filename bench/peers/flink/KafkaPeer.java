// Apache Flink's side of bench/peers/kafka/compare.sh (issue 16): the keyed count
// from a Kafka topic to a Kafka topic, as `weir bench --source kafka --sink kafka`
// runs it, with flink-connector-kafka: KafkaSource (bounded at the end offsets seen
// at start, read_committed) -> keyBy(key) -> running count in ValueState ->
// KafkaSink (AT_LEAST_ONCE or EXACTLY_ONCE). Closed loop: one JSON line per run
// with the job's net runtime (JobExecutionResult.getNetRuntime: from the job's
// start to its end, after the final checkpoint committed the last transaction).
//
//   java -cp "pyflink/lib/*:connector-jars/*:.build" KafkaPeer --brokers H:P --topic IN
//        --partitions P --events N --modes at-least-once,aligned --intervals 10,100
//        --parallelism 2 --checkpoint-dir DIR --json PATH
//
// Input record values are weir's `key,value,stamp`; output values `key,count,stamp`
// with the key as record key, as weir writes them.
//
// Open loop (issue 51): `--open IN:OUT --modes M --intervals I [--stop-file F]` runs one
// job, unbounded, from topic IN (from its start, read_committed) to topic OUT, both
// created if missing, until file F appears (then cancelled) or the process is stopped; `weir bench --source kafka --sink kafka --external-job
// IN:OUT --rate R` feeds IN and reads OUT as it does for weir's own job
// (bench/peers/kafka/compare.sh).

import java.io.FileWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Locale;
import java.util.Properties;

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

public class KafkaPeer {
    static String brokers, topic, checkpointDir, jsonPath;
    static int partitions = 2, parallelism = 2;
    static long events;
    static String[] modes = {"at-least-once", "aligned"};
    static long[] intervals = {10, 100};
    static String openIn, openOut, stopFile;

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < args.length; i += 2) {
            String v = args[i + 1];
            switch (args[i]) {
                case "--brokers": brokers = v; break;
                case "--topic": topic = v; break;
                case "--partitions": partitions = Integer.parseInt(v); break;
                case "--events": events = Long.parseLong(v); break;
                case "--modes": modes = v.split(","); break;
                case "--intervals": {
                    String[] s = v.split(",");
                    intervals = new long[s.length];
                    for (int j = 0; j < s.length; j++) intervals[j] = Long.parseLong(s[j]);
                    break;
                }
                case "--parallelism": parallelism = Integer.parseInt(v); break;
                case "--checkpoint-dir": checkpointDir = v; break;
                case "--json": jsonPath = v; break;
                case "--stop-file": stopFile = v; break;
                case "--open": {
                    int c = v.indexOf(':');
                    openIn = v.substring(0, c);
                    openOut = v.substring(c + 1);
                    break;
                }
                default: throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (openIn != null) {
            runOpen(modes[0], intervals[0]);
            return;
        }
        for (String mode : modes) {
            for (long interval : intervals) {
                String json = run(mode, interval);
                System.out.println(json);
                if (jsonPath != null) {
                    try (PrintWriter w = new PrintWriter(new FileWriter(jsonPath, true))) {
                        w.println(json);
                    }
                }
            }
        }
    }

    /** The running count per key; emits `key,count,stamp`. */
    static class Count extends KeyedProcessFunction<Long, String, String> {
        transient ValueState<Long> count;

        @Override
        public void open(OpenContext ctx) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Long.class));
        }

        @Override
        public void processElement(String v, Context ctx, Collector<String> out) throws Exception {
            Long c = count.value();
            long n = c == null ? 1 : c + 1;
            count.update(n);
            int a = v.indexOf(','), b = v.lastIndexOf(',');
            out.collect(v.substring(0, a) + "," + n + v.substring(b));
        }
    }

    /** Open loop: one unbounded job from `openIn` to `openOut`, until the process is stopped. */
    static void runOpen(String mode, long intervalMs) throws Exception {
        Properties admin = new Properties();
        admin.setProperty("bootstrap.servers", brokers);
        try (Admin a = Admin.create(admin)) {
            for (String t : new String[] {openIn, openOut}) {
                try {
                    a.createTopics(java.util.List.of(new NewTopic(t, partitions, (short) 1))).all().get();
                } catch (java.util.concurrent.ExecutionException e) {
                    if (!(e.getCause() instanceof org.apache.kafka.common.errors.TopicExistsException)) throw e;
                }
            }
        }
        StreamExecutionEnvironment env = build(mode, intervalMs, openIn, openOut, false);
        var job = env.executeAsync("flink-kafka-keyed-open-" + mode + "-" + intervalMs);
        System.out.println("flink job " + job.getJobID() + " submitted: " + openIn + " -> " + openOut
                + ", " + mode + ", checkpoints every " + intervalMs + " ms");
        // Runs until the stop file appears (then cancelled: the sink's writers abort
        // their open transactions as they close, and no transaction is left for the
        // broker to time out later, in another row's run), or the process is stopped.
        while (stopFile == null || !new java.io.File(stopFile).exists()) {
            if (job.getJobStatus().get().isGloballyTerminalState()) {
                job.getJobExecutionResult().get();
                return;
            }
            Thread.sleep(50);
        }
        job.cancel().get();
        System.out.println("flink job " + job.getJobID() + " cancelled");
    }

    static String run(String mode, long intervalMs) throws Exception {
        String output = "flink-out-" + mode + "-" + intervalMs + "-" + System.currentTimeMillis();
        // The test broker does not create topics on first use.
        Properties admin = new Properties();
        admin.setProperty("bootstrap.servers", brokers);
        try (Admin a = Admin.create(admin)) {
            a.createTopics(java.util.List.of(new NewTopic(output, partitions, (short) 1))).all().get();
        }
        StreamExecutionEnvironment env = build(mode, intervalMs, topic, output, true);
        boolean exactly = !mode.equals("at-least-once");
        JobExecutionResult r = env.execute("flink-kafka-keyed-" + mode + "-" + intervalMs);
        double seconds = r.getNetRuntime() / 1e3;
        return String.format(Locale.ROOT,
                "{\"engine\":\"flink\",\"pipeline\":\"kafka-keyed\",\"mode\":\"%s\",\"sink\":\"%s\","
                        + "\"checkpoint_interval_ms\":%d,\"partitions\":%d,\"parallelism\":%d,\"rate\":null,"
                        + "\"events\":%d,\"seconds\":%.3f,\"events_per_sec\":%.1f,\"output_topic\":\"%s\"}",
                mode, exactly ? "flink-exactly-once" : "flink-at-least-once", intervalMs, partitions, parallelism,
                events, seconds, events / seconds, output);
    }

    /** The job from `input` to `output`: bounded at the end offsets seen at its start, or unbounded. */
    static StreamExecutionEnvironment build(String mode, long intervalMs, String input, String output,
            boolean bounded) {
        boolean exactly = !mode.equals("at-least-once");
        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
        conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
        conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, "file://" + checkpointDir + "/" + mode + "-" + intervalMs);
        conf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(intervalMs));
        conf.set(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE,
                exactly ? CheckpointingMode.EXACTLY_ONCE : CheckpointingMode.AT_LEAST_ONCE);
        if (!bounded) {
            // Open loop, for latency: every record goes downstream at once, not in a
            // network buffer that waits up to 100 ms (Flink's default, for throughput);
            // Flink's docs' advice for low latency, and run.sh's open loop's setting.
            conf.set(ExecutionOptions.BUFFER_TIMEOUT, Duration.ZERO);
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(parallelism);

        Properties consumer = new Properties();
        consumer.setProperty("isolation.level", "read_committed");
        var builder = KafkaSource.<String>builder()
                .setBootstrapServers(brokers)
                .setTopics(input)
                .setGroupId("flink-peer-" + System.nanoTime())
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setValueOnlyDeserializer(new SimpleStringSchema())
                .setProperties(consumer);
        if (bounded) {
            builder.setBounded(OffsetsInitializer.latest());
        }
        KafkaSource<String> source = builder.build();
        Properties producer = new Properties();
        // The broker's transaction.max.timeout.ms is 15 min; Flink's default is 1 h.
        producer.setProperty("transaction.timeout.ms", "60000");
        producer.setProperty("linger.ms", "5");
        SerializationSchema<String> key = s -> s.substring(0, s.indexOf(',')).getBytes(StandardCharsets.UTF_8);
        var sink = KafkaSink.<String>builder()
                .setBootstrapServers(brokers)
                .setRecordSerializer(KafkaRecordSerializationSchema.<String>builder()
                        .setTopic(output)
                        .setKeySerializationSchema(key)
                        .setValueSerializationSchema(new SimpleStringSchema())
                        .build())
                .setDeliveryGuarantee(exactly ? DeliveryGuarantee.EXACTLY_ONCE : DeliveryGuarantee.AT_LEAST_ONCE)
                .setTransactionalIdPrefix("flink-peer-" + System.nanoTime())
                .setKafkaProducerConfig(producer)
                .build();
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka")
                .keyBy(v -> Long.parseLong(v.substring(0, v.indexOf(','))))
                .process(new Count())
                .sinkTo(sink);
        return env;
    }
}
